"""`hybridllm serve` refuses bad settings as a usage error (exit status 2), as `hybridllm-cloud` does,
before it binds the port or loads a model.

Before: an unreadable ``--api-key-file``, a ``--config`` file that is not there or a bad
``HYBRIDLLM_*`` value printed ``error: ...`` and exited 1 (after binding the port), while
``hybridllm-cloud serve`` exits 2 for the same mistakes; a script could not tell a typo from a
failure at run time. A port that cannot be bound stays an error (exit 1) in both.
"""

from __future__ import annotations

import pytest

pytest.importorskip("uvicorn")

from hybridllm import cli  # noqa: E402
from hybridllm._exceptions import ConfigError  # noqa: E402


class _Bound(Exception):
    pass


@pytest.fixture
def no_bind(monkeypatch, tmp_path):
    def listen(*args, **kwargs):
        raise _Bound  # a valid command line gets this far, and no further here
    monkeypatch.setattr("hybridllm._serve_cli.listen", listen)
    monkeypatch.setenv("HOME", str(tmp_path))  # no config.toml of the machine's
    monkeypatch.delenv("HYBRIDLLM_CONFIG", raising=False)
    monkeypatch.delenv("HYBRIDLLM_SERVE_API_KEYS", raising=False)


@pytest.mark.parametrize(("argv", "env", "says"), [
    (["--api-key-file", "{tmp}/missing-keys"], {}, "cannot read API key file"),
    (["--config", "{tmp}/missing.toml"], {}, "does not exist"),
    ([], {"HYBRIDLLM_EDGE_MAX_WAITING": "abc"}, "HYBRIDLLM_EDGE_MAX_WAITING='abc' is not a valid int"),
])
def test_bad_settings_are_a_usage_error_before_the_port_is_bound(no_bind, monkeypatch, capsys, tmp_path,
                                                                 argv, env, says):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = cli.main(["serve", "--port", "0", *(a.format(tmp=tmp_path) for a in argv)])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("hybridllm serve: error: ") and says in err[0], err


def test_good_settings_go_on_to_bind_and_a_port_that_fails_stays_exit_1(no_bind, monkeypatch, capsys,
                                                                        tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("k1\n")
    monkeypatch.setenv("HYBRIDLLM_DEBUG", "1")  # the unexpected _Bound is raised, not printed
    with pytest.raises(_Bound):
        cli.main(["serve", "--port", "0", "--api-key-file", str(keys)])

    def cannot_listen(*args, **kwargs):
        raise ConfigError("Cannot listen on 127.0.0.1:1: Permission denied.")
    monkeypatch.setattr("hybridllm._serve_cli.listen", cannot_listen)
    monkeypatch.delenv("HYBRIDLLM_DEBUG")
    assert cli.main(["serve", "--port", "1"]) == 1
    assert capsys.readouterr().err.startswith("error: Cannot listen")
