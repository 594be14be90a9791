"""`hybridllm serve` on loopback answers only requests addressed to this machine (DNS rebinding).

Before: the proxy refused cross-site requests by ``Origin``, but a page whose site name the attacker
re-points at 127.0.0.1 after it loaded (DNS rebinding) is same-origin to the browser: its GETs carry
no ``Origin``, so it could read ``/v1/models`` and ``/stats``. Measured on a real socket: ``GET
/stats`` with ``Host: rebind.evil.example:8080`` was a 200 with the proxy's counters. Such requests
still name the attacker's site in ``Host``; now they are 403 ``host_not_allowed``.
"""

from __future__ import annotations

import argparse

import httpx
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app, host_name, serve_hosts  # noqa: E402

EVIL = "rebind.evil.example"


def test_a_rebound_name_is_refused_on_a_real_socket_and_loopback_names_pass():
    openai = pytest.importorskip("openai")
    from tests.cloud_server.api.helpers import ThreadServer

    edge = FakeBackend(reply=lambda m: "device answer")
    llm = HybridLLM(edge=edge, cache=False)
    server = ThreadServer(create_app(llm, allow_hosts=serve_hosts("127.0.0.1", []))).start()
    port = server.port
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            refused = {path: client.get(path, headers={"host": f"{EVIL}:{port}"})
                       for path in ("/stats", "/v1/models", "/health", "/openapi.json")}
            post = client.post("/v1/chat/completions", headers={"host": EVIL},
                               json={"model": "x", "messages": [{"role": "user", "content": "hi"}]})
            local = [client.get("/v1/models", headers={"host": h}).status_code
                     for h in (f"localhost:{port}", f"[::1]:{port}", "LOCALHOST.", "127.0.0.1")]
        api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=10)
        listed = [m.id for m in api.models.list()]
        answer = api.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
    finally:
        server.stop()
        llm.close()
    for path, r in refused.items():
        assert r.status_code == 403, (path, r.text)
        error = r.json()["error"]
        assert error["code"] == "host_not_allowed" and error["type"] == "invalid_request_error"
        assert f"--allow-host {EVIL}" in error["message"], error["message"]
    assert set(refused["/stats"].json()) == {"error"}  # none of the counters
    assert post.status_code == 403 and len(edge.calls) == 1  # only the openai client's request ran
    assert local == [200, 200, 200, 200]
    assert listed == ["hybridllm", "fake-model"]
    assert answer.choices[0].message.content == "device answer"


def test_without_allow_hosts_the_app_answers_any_host():
    """``create_app`` embedded by an application (behind its own server) keeps its old behaviour."""
    llm = HybridLLM(edge=FakeBackend(), cache=False)
    with TestClient(create_app(llm)) as http:
        assert http.get("/v1/models", headers={"host": EVIL}).status_code == 200
    llm.close()


@pytest.mark.parametrize(("bound", "allowed", "expected"), [
    ("127.0.0.1", [], ["localhost", "127.0.0.1", "::1"]),
    ("127.0.0.2", ["Chat.Example.com:443"], ["localhost", "127.0.0.1", "::1", "chat.example.com",
                                              "127.0.0.2"]),
    ("::1", [], ["localhost", "127.0.0.1", "::1"]),
    ("0.0.0.0", [], None),  # exposed to a network: any name, unless names are given
    ("192.168.1.5", ["chat.lan"], ["localhost", "127.0.0.1", "::1", "chat.lan", "192.168.1.5"]),
    ("0.0.0.0", ["chat.lan"], ["localhost", "127.0.0.1", "::1", "chat.lan"]),
    ("127.0.0.1", ["*"], None),
])
def test_the_names_serve_answers(bound, allowed, expected):
    assert serve_hosts(bound, allowed) == expected


@pytest.mark.parametrize(("header", "name"), [
    ("localhost:8080", "localhost"), ("[::1]:8080", "::1"), ("[0:0:0:0:0:0:0:1]", "::1"),
    ("Example.COM.", "example.com"), ("127.0.0.1", "127.0.0.1"), ("::1", "::1"),
])
def test_host_name_drops_the_port_and_spells_one_way(header, name):
    assert host_name(header) == name


def _serve(monkeypatch, argv: list[str], hosts: list[str]) -> list[int]:
    """Runs ``hybridllm serve ARGV`` with the server's run replaced: the statuses of GET
    /v1/models addressed to each of ``hosts``."""
    from hybridllm import _client, _serve_cli
    from hybridllm.wire import shutdown

    statuses: list[int] = []

    def run(self, sockets=None):
        with TestClient(self.config.app, base_url="http://127.0.0.1") as http:
            statuses.extend(http.get("/v1/models", headers={"host": h}).status_code for h in hosts)

    monkeypatch.setattr(_client, "HybridLLM", lambda **kw: HybridLLM(edge=FakeBackend(), cache=False))
    monkeypatch.setattr(shutdown.GracefulServer, "run", run)
    parser = argparse.ArgumentParser()
    _serve_cli.register(parser.add_subparsers())
    assert _serve_cli.cmd_serve(parser.parse_args(["serve", "--port", "0", "--no-cache", *argv])) == 0
    return statuses


def test_serve_on_loopback_refuses_other_names_and_allow_host_lets_one_in(monkeypatch):
    hosts = ["127.0.0.1:8080", "chat.example.com", EVIL]
    assert _serve(monkeypatch, [], hosts) == [200, 403, 403]
    assert _serve(monkeypatch, ["--allow-host", "chat.example.com"], hosts) == [200, 200, 403]
    assert _serve(monkeypatch, ["--allow-host", "*"], hosts) == [200, 200, 200]


def test_serve_on_all_addresses_answers_any_name_unless_names_are_given(monkeypatch):
    hosts = ["192.168.1.5:8080", EVIL, "localhost"]
    assert _serve(monkeypatch, ["--host", "0.0.0.0"], hosts) == [200, 200, 200]
    assert _serve(monkeypatch, ["--host", "0.0.0.0", "--allow-host", "192.168.1.5"], hosts) == [200, 403, 200]


@pytest.mark.parametrize("value", ["https://chat.example.com", "chat.example.com/v1", "", "a b"])
def test_allow_host_that_is_no_host_name_is_a_usage_error(value, capsys):
    from hybridllm import _serve_cli

    parser = argparse.ArgumentParser()
    _serve_cli.register(parser.add_subparsers())
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["serve", "--allow-host", value])
    assert exit_.value.code == 2
    assert "expected a host name or address" in capsys.readouterr().err
