"""`hybridllm serve`'s string options refuse a blank value (an unset shell variable) at once.

Before: ``--host ""`` (or ``" "``, ``"0.0.0.0 "``) passed the parser and failed at the bind, exit 1,
``Cannot listen on :8080: Name or service not known``, naming no option; ``--api-key ""`` was
dropped, so the server ran open, silently on loopback; ``--config ""`` read as no ``--config``
(``$HYBRIDLLM_CONFIG`` or the default file was loaded instead); ``--model ""`` served the default
model and ``--model " "`` failed only once the port was bound; ``--api-key-file ""`` said
``cannot read API key file .: Is a directory``. Now each is a usage error naming the option, exit
status 2, before anything is bound or loaded.
"""

from __future__ import annotations

import pytest

from hybridllm import cli


@pytest.fixture
def nothing_runs(monkeypatch, tmp_path):
    """Any bind or model load is a test failure: the refusal comes first."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("HYBRIDLLM_SERVE_API_KEYS", raising=False)
    config = tmp_path / "env.toml"
    config.write_text("threshold = 0.5\n")
    monkeypatch.setenv("HYBRIDLLM_CONFIG", str(config))  # what `--config ""` silently loaded

    def fail(*args, **kwargs):
        raise AssertionError("bound or loaded despite a blank option")
    monkeypatch.setattr("hybridllm._serve_cli.listen", fail)
    monkeypatch.setattr("hybridllm._client.HybridLLM", fail)


def _exit_status(*argv: str) -> int:
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error, as the script exits
        cli.main(list(argv))
    return exit_.value.code


@pytest.mark.parametrize(("option", "value"), [
    ("--host", ""), ("--host", " "), ("--host", "0.0.0.0 "), ("--host", " 127.0.0.1"),
    ("--host", "local host"),
    ("--api-key", ""), ("--api-key", "  "),
    ("--config", ""), ("--config", " "),
    ("--model", ""), ("--model", " "),
    ("--api-key-file", ""), ("--api-key-file", " "),
])
def test_a_blank_value_is_a_usage_error_naming_the_option(nothing_runs, capsys, option, value):
    assert _exit_status("serve", option, value) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hybridllm serve: error: argument {option}: "), err
    assert repr(value) in err[0] and "Traceback" not in err[0]


def test_config_show_refuses_a_blank_config_too(nothing_runs, capsys):
    assert _exit_status("config", "show", "--config", "") == 2
    err = capsys.readouterr()
    assert "argument --config" in err.err and err.out == ""


@pytest.mark.parametrize("value", ["127.0.0.1", "::1", "0.0.0.0", "localhost", "[::1]"])
def test_hosts_without_spaces_parse_as_given(value):
    args = cli.build_parser().parse_args(["serve", "--host", value])
    assert args.host == value
