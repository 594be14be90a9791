"""``hybridllm-cloud serve``: blank or spaced string options are usage errors naming the option, and
``RAY_ADDRESS`` (which ``ray.init`` joins when given no address) is taken as ``--ray-address``.
In-process, the parser and ``_cluster_config`` only: no model, no Ray.

Before: ``--host ""`` failed at the bind ("Cannot listen on :0", exit 1, no option named) and with
``--replicas`` passed the port check as every interface; ``--served-model-name ""`` silently served
the default name and ``" "`` a name of spaces; ``--system-prompt " "`` was sent as a system message;
``--draft-model ""`` and ``--api-key-file ""`` were read as the folder ``.``. With ``RAY_ADDRESS``
set, Ray joined that cluster while the command handled it as a local Ray of its own: another
serve's app there was replaced without the check ``--ray-address`` does."""

from __future__ import annotations

import pytest

import cloud_server.__main__ as cli
from cloud_server.cli_parser import UsageError, build_parser
from cloud_server.cli_settings import _cluster_config

MODEL = ["serve", "--model", "smollm2-135m-instruct"]


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("host", ["", " ", "0.0.0.0 ", " 127.0.0.1", "local host"])
def test_a_blank_or_spaced_host_is_a_usage_error_naming_it(host: str, capsys) -> None:
    err = _usage_error([*MODEL, "--host", host], capsys)
    assert "argument --host: expected an address or host name to bind" in err
    assert repr(host) in err and "Traceback" not in err


def test_a_blank_host_never_reaches_the_bind(capsys, monkeypatch) -> None:
    monkeypatch.setattr(cli, "listen", lambda *a: pytest.fail("bound a blank --host"))
    with pytest.raises(SystemExit) as exc:
        cli.main([*MODEL, "--host", "", "--port", "0"])
    assert exc.value.code == 2
    assert "--host" in capsys.readouterr().err


@pytest.mark.parametrize(("option", "value"), [
    ("--model", ""), ("--model", "  "), ("--served-model-name", ""), ("--served-model-name", " "),
    ("--served-model-name", "my-model "), ("--draft-model", ""), ("--api-key-file", ""),
    ("--system-prompt", " "), ("--system-prompt", "\n"),
])
def test_a_blank_string_option_is_a_usage_error_naming_it(option: str, value: str, capsys) -> None:
    argv = ["serve", "--model", "m", option, value] if option != "--model" else ["serve", option, value]
    err = _usage_error(argv, capsys)
    assert f"argument {option}:" in err and repr(value) in err


@pytest.mark.parametrize(("option", "value"), [
    ("--host", "0.0.0.0"), ("--host", "::"), ("--host", "localhost"), ("--served-model-name", "a b"),
    ("--system-prompt", ""), ("--system-prompt", " You are terse. "), ("--model", "./m.gguf"),
])
def test_good_values_still_parse(option: str, value: str) -> None:
    args = build_parser().parse_args(["serve", "--model", "m", option, value])
    assert getattr(args, option[2:].replace("-", "_")) == value


def _cluster(monkeypatch, env: str | None, *extra: str):
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    return _cluster_config(build_parser().parse_args([*MODEL, "--replicas", "2", "--port", "9000", *extra]))


def test_ray_address_from_the_environment_is_joined_as_ray_does(monkeypatch) -> None:
    assert _cluster(monkeypatch, "10.0.0.1:6379").ray_address == "10.0.0.1:6379"
    # --replace goes with a cluster joined, however it was named
    assert _cluster(monkeypatch, "10.0.0.1:6379", "--replace").replace_app is True
    # the option wins over the environment, as in ray.init
    assert _cluster(monkeypatch, "10.0.0.1:6379", "--ray-address", "auto").ray_address == "auto"
    # unset or empty (Ray ignores an empty one): a local Ray, as before
    assert _cluster(monkeypatch, None).ray_address is None
    assert _cluster(monkeypatch, "").ray_address is None


def test_a_bad_ray_address_in_the_environment_names_the_variable(monkeypatch) -> None:
    with pytest.raises(UsageError, match=r"^RAY_ADDRESS 'http://127.0.0.1:8265' is not an address .* unset"):
        _cluster(monkeypatch, "http://127.0.0.1:8265")


def test_ray_address_is_not_read_without_replicas(monkeypatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "not an address")
    assert _cluster_config(build_parser().parse_args(MODEL)) is None
