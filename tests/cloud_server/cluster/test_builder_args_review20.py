"""``serve run cloud_server.cluster.app:app_builder model=X replicas=2`` passes every arg as a
string; app_builder types them as its fields say. Before: "--replicas must be an integer >= 1,
got '2'", and replica_cpus or max_num_seqs failed the same way."""

from __future__ import annotations

import pytest

from cloud_server.cluster.builder_args import field_types, typed_args


def test_strings_are_typed_as_the_fields_say():
    got = typed_args({"model": "m.gguf", "replicas": "2", "replica_cpus": "0.5", "max_num_seqs": " 8 ",
                      "enable_prefix_caching": "false", "enforce_eager": "True", "max_model_len": "none",
                      "api_keys": "k1, k2", "power_watts": "150", "served_model_name": "42"})
    assert got == {"model": "m.gguf", "replicas": 2, "replica_cpus": 0.5, "max_num_seqs": 8,
                   "enable_prefix_caching": False, "enforce_eager": True, "max_model_len": None,
                   "api_keys": ["k1", "k2"], "power_watts": 150.0, "served_model_name": "42"}
    assert type(got["replicas"]) is int and type(got["power_watts"]) is float


def test_typed_values_and_unknown_args_are_left_as_they_are():
    args = {"replicas": 3, "enable_prefix_caching": False, "nope": "1", "api_keys": ["a"]}
    assert typed_args(args) == args


@pytest.mark.parametrize(("arg", "value", "words"), [
    ("replicas", "two", "a whole number"),
    ("replicas", "2.5", "a whole number"),
    ("replica_cpus", "half", "a number"),
    ("enable_prefix_caching", "maybe", "true or false"),
    ("max_model_len", "lots", "a whole number"),
])
def test_a_value_of_the_wrong_kind_names_the_arg(arg, value, words):
    with pytest.raises(ValueError, match=f"app_builder arg {arg}='{value}' is not {words}"):
        typed_args({arg: value})


def test_every_field_has_a_type_the_rules_know():
    simple = {str, int, float, bool, list, type(None)}
    for name, kind in field_types().items():
        parts = set(getattr(kind, "__args__", ())) or {kind}
        assert parts <= simple, (name, kind)


def test_app_builder_takes_serve_runs_string_args():
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from ray.serve import Application

    from cloud_server.cluster.app import app_builder

    app = app_builder({"model": "m.gguf", "replicas": "2", "num_threads": "1", "max_body_bytes": "1048576"})
    assert isinstance(app, Application)
    assert app._bound_deployment.init_args[4] == {"max_body_bytes": 1 << 20}
    with pytest.raises(ValueError, match="replicas='two'"):
        app_builder({"model": "m.gguf", "replicas": "two"})
