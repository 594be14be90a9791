"""Every JSON the hybridllm CLI prints is valid JSON: a number that is not finite is null (review 30).

Before: ``config show`` printed ``Infinity`` for a setting given as inf (``cache_ttl_s``,
``edge_wait_timeout_s``, ``cloud_stall_timeout_s`` take inf as "no bound", as None), ``models list
--json`` a bare ``NaN`` for a catalog's NaN size, and ``router eval --json`` (and the summaries of
``router train``, ``label`` and ``calibrate``) a NaN figure as it came: text that no JSON parser
but Python's reads. They now go through ``hybridllm._finite.finite_json`` (``ask --json``'s rule
since review 29: null), with ``allow_nan=False`` so that a number it missed fails loudly. A NaN
setting cannot reach ``config show``: it is refused first (checked here too)."""

from __future__ import annotations

import json
import math

import pytest

from hybridllm import _finite as finite_module
from hybridllm import cli
from hybridllm._finite import finite_json
from hybridllm.models import catalog

INF_SETTINGS = ["cache_ttl_s", "edge_wait_timeout_s", "cloud_stall_timeout_s"]


def strict(text: str):
    def refuse(token: str) -> object:
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(autouse=True)
def _no_user_settings(monkeypatch, tmp_path):
    for name in INF_SETTINGS:
        monkeypatch.delenv(f"HYBRIDLLM_{name.upper()}", raising=False)
    (tmp_path / "empty.toml").write_text("", encoding="utf-8")  # no user's config.toml is read
    monkeypatch.setenv("HYBRIDLLM_CONFIG", str(tmp_path / "empty.toml"))


@pytest.mark.parametrize("name", INF_SETTINGS)
def test_config_show_prints_an_inf_setting_from_the_environment_as_null(name, monkeypatch, capsys):
    monkeypatch.setenv(f"HYBRIDLLM_{name.upper()}", "inf")
    assert cli.main(["config", "show"]) == 0
    shown = strict(capsys.readouterr().out)  # before: "cache_ttl_s": Infinity
    assert shown[name] is None  # no bound, as None says
    assert shown["price_per_1k_tokens"] == 0.002  # the finite settings as they are


def test_config_show_prints_an_inf_setting_from_a_config_file_as_null(tmp_path, capsys):
    path = tmp_path / "config.toml"
    path.write_text("cache_ttl_s = inf\nedge_wait_timeout_s = +inf\ncloud_read_timeout_s = 30.5\n",
                    encoding="utf-8")
    assert cli.main(["config", "show", "--config", str(path)]) == 0
    shown = strict(capsys.readouterr().out)
    assert shown["cache_ttl_s"] is None and shown["edge_wait_timeout_s"] is None
    assert shown["cloud_read_timeout_s"] == 30.5
    assert shown["config_file"] == str(path)


@pytest.mark.parametrize("name", INF_SETTINGS)
def test_a_nan_setting_never_reaches_config_show_it_is_refused(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(f"HYBRIDLLM_{name.upper()}", "nan")
    assert cli.main(["config", "show"]) == 1  # one error line naming the setting, no JSON
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error:") and name in err and "nan" in err
    monkeypatch.delenv(f"HYBRIDLLM_{name.upper()}")
    path = tmp_path / "config.toml"
    path.write_text(f"{name} = nan\n", encoding="utf-8")
    assert cli.main(["config", "show", "--config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error:") and name in err


def test_models_list_json_never_prints_a_catalog_nan_size(tmp_path, monkeypatch, capsys):
    # a damaged catalog.json: Python's json reads NaN and 1e999 (inf) as sizes
    text = """{"models": [{"id": "tiny-test", "kind": "gguf", "description": "d", "package": "p",
        "package_version": "1", "pip": "pip install p", "source": {}, "license": "mit",
        "architecture": "llama", "chat_format": null,
        "files": {"a.gguf": {"sha256": "00", "size": NaN}}},
        {"id": "huge-test", "kind": "gguf", "description": "d", "package": "q",
        "package_version": "1", "pip": "pip install q", "source": {}, "license": "mit",
        "architecture": "llama", "chat_format": null,
        "files": {"b.gguf": {"sha256": "11", "size": 1e999}}}]}"""
    (tmp_path / "catalog.json").write_text(text, encoding="utf-8")
    monkeypatch.setattr(catalog, "assets_dir", lambda: tmp_path)
    catalog.load_catalog.cache_clear()
    try:
        code = cli.main(["models", "list", "--json"])
    finally:
        catalog.load_catalog.cache_clear()  # the shipped catalog again for the other tests
    out, err = capsys.readouterr()
    # before: "size_mb": NaN on stdout; the loader now refuses the damaged catalog (68090d9,
    # tests/models/test_catalog_numbers_review30.py), so nothing non-JSON reaches stdout
    assert code == 1 and out == "", (code, out)
    assert err.startswith("error:") and "tiny-test" in err and "size" in err


def test_router_eval_json_prints_a_nan_figure_as_null(tmp_path, monkeypatch, capsys):
    data = tmp_path / "labels.csv"
    data.write_text("prompt,weak,strong\nhi,0,1\n", encoding="utf-8")
    result = {"apgr": math.nan, "cpt50": math.inf, "cpt80": 0.4, "calls_at_95": 0.9, "n": 1,
              "curve": [[0.0, math.nan]]}
    monkeypatch.setattr("hybridllm.router._cli_eval.evaluate_router_on", lambda *a, **k: result)
    assert cli.main(["router", "eval", "--data", str(data), "--json"]) == 0
    shown = strict(capsys.readouterr().out)  # before: "apgr": NaN
    assert shown["apgr"] is None and shown["cpt50"] is None and shown["curve"] == [[0.0, None]]
    assert shown["cpt80"] == 0.4 and shown["n"] == 1


@pytest.mark.parametrize("compact", [False, True])
def test_the_router_commands_summary_prints_a_nan_figure_as_null(compact, capsys):
    from hybridllm.router._cli_commands import _print

    _print({"threshold": math.nan, "cloud_fraction": -math.inf, "rows": 3, "_compact": compact})
    out = capsys.readouterr().out
    assert strict(out) == {"threshold": None, "cloud_fraction": None, "rows": 3, "_compact": compact}
    assert (out.count("\n") == 1) is compact


def test_finite_json_fails_loudly_on_a_number_it_did_not_make_null(monkeypatch):
    assert strict(finite_json({"a": math.nan, "b": [math.inf, 1.5], "c": (-math.inf,)})) == \
        {"a": None, "b": [None, 1.5], "c": [None]}
    monkeypatch.setattr(finite_module, "_finite", lambda value: value)  # as if it missed one
    with pytest.raises(ValueError):
        finite_json({"a": math.nan})
