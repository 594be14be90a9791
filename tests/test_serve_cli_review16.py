"""`hybridllm serve` closes the port it bound when it ends before serving: a model that cannot be
loaded, or Ctrl-C while it loads (before: the listening socket was left open until collected)."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("uvicorn")

from hybridllm import cli  # noqa: E402
from hybridllm._exceptions import ConfigError  # noqa: E402


@pytest.mark.parametrize("error", [ConfigError("Unknown model 'nosuch'."), KeyboardInterrupt()])
def test_the_bound_socket_is_closed_when_the_model_fails_to_load(monkeypatch, tmp_path, capsys, error):
    monkeypatch.setenv("HOME", str(tmp_path))  # no config.toml of the machine's
    monkeypatch.delenv("HYBRIDLLM_CONFIG", raising=False)
    monkeypatch.delenv("HYBRIDLLM_SERVE_API_KEYS", raising=False)
    bound: list[socket.socket] = []

    def listen(host, port, error_type):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        bound.append(sock)
        return sock

    def no_model(**kw):
        raise error

    monkeypatch.setattr("hybridllm._serve_cli.listen", listen)
    monkeypatch.setattr("hybridllm._client.HybridLLM", no_model)
    try:
        code = cli.main(["serve", "--port", "0"])
        assert code == (130 if isinstance(error, KeyboardInterrupt) else 1)
        assert len(bound) == 1 and bound[0].fileno() == -1  # closed: the port is free again
    finally:
        for sock in bound:
            sock.close()
