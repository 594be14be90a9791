"""A port in use says what to do: stop the other program or pick another --port (0: any free one).
Before, `hybridllm serve` (on 8080, llama.cpp's server's port too) said only "Address already in
use", naming no way past it."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("uvicorn")

from hybridllm import cli  # noqa: E402


def test_a_port_in_use_names_the_way_out(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("HYBRIDLLM_CONFIG", raising=False)
    monkeypatch.delenv("HYBRIDLLM_SERVE_API_KEYS", raising=False)
    monkeypatch.setattr("hybridllm._client.HybridLLM", lambda **kw: pytest.fail("no model loads"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert cli.main(["serve", "--port", str(port)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    assert err[0].startswith(f"error: Cannot listen on 127.0.0.1:{port}: ")
    assert "pick another port with --port (0 takes any free one)" in err[0]


def test_other_failures_get_no_port_advice(monkeypatch, tmp_path, capsys):
    from hybridllm._cli_options import listen
    from hybridllm._exceptions import ConfigError

    with pytest.raises(ConfigError) as info:
        listen("192.0.2.1", 0, ConfigError)  # an address of no interface here
    assert "--port" not in str(info.value)
