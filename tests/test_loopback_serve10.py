"""One meaning of "this machine" (loopback) for `hybridllm serve`: its Origin check and CORS, its
Host allowlist and its no-API-key warning all ask ``hybridllm._loopback``.

Before, three spellings disagreed with the network: the whole of 127.0.0.0/8 is loopback, yet a
local page on http://127.0.0.2:5173 was a 403 ``origin_not_allowed`` (the Origin regex knew only
127.0.0.1), a request with ``Host: 127.0.0.2`` to a server on 0.0.0.0 with --allow-host was a 403
``host_not_allowed``, and ``--host 127.0.0.2`` warned that anyone could reach the server.
"""

from __future__ import annotations

import argparse

import httpx
import pytest

from hybridllm._loopback import host_name, is_loopback, is_loopback_origin

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app, serve_hosts  # noqa: E402

BODY = b'{"model": "x", "messages": [{"role": "user", "content": "hi"}]}'


@pytest.mark.parametrize("host", [
    "localhost", "LocalHost.", "localhost:8080", "127.0.0.1", "127.0.0.2", "127.255.255.254:80",
    "::1", "[::1]", "[::1]:8080", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", "[::ffff:127.0.0.9]:80",
])
def test_loopback_names_and_addresses(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", [
    "0.0.0.0", "::", "192.168.1.5", "128.0.0.1", "126.255.255.255", "::2", "::ffff:10.0.0.1",
    "localhost.evil.example", "127.0.0.1.evil.example", "evil.example", "",
])
def test_other_hosts_are_not_loopback(host):
    assert not is_loopback(host)


@pytest.mark.parametrize(("origin", "local"), [
    ("http://localhost:3000", True), ("https://localhost", True), ("http://127.0.0.2:5173", True),
    ("http://[::1]:8080", True), ("http://127.0.0.1", True),
    ("null", False), ("http://localhost.evil.example", False), ("http://127.0.0.1.evil.example", False),
    ("http://evil@127.0.0.1", False), ("ftp://localhost", False), ("http://192.168.1.5:3000", False),
    ("http://127.0.0.1/page", False), ("https://evil.example", False),
])
def test_which_origins_are_pages_of_this_machine(origin, local):
    assert is_loopback_origin(origin) is local


def test_host_name_is_still_served_by_the_proxy_module():
    from hybridllm import proxy

    assert proxy.host_name is host_name and host_name("[0:0::1]:80") == "::1"


def test_a_page_on_another_loopback_address_is_answered_with_cors_on_a_real_socket():
    from tests.cloud_server.api.helpers import ThreadServer

    page = "http://127.0.0.2:5173"
    edge = FakeBackend(reply=lambda m: "device answer")
    llm = HybridLLM(edge=edge, cache=False)
    server = ThreadServer(create_app(llm, allow_hosts=serve_hosts("127.0.0.1", []))).start()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            preflight = client.options("/v1/chat/completions", headers={
                "origin": page, "access-control-request-method": "POST",
                "access-control-request-headers": "content-type"})
            answer = client.post("/v1/chat/completions", content=BODY,
                                 headers={"origin": page, "content-type": "application/json"})
            evil = client.post("/v1/chat/completions", content=BODY,
                               headers={"origin": "http://127.0.0.1.evil.example",
                                        "content-type": "application/json"})
    finally:
        server.stop()
        llm.close()
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] == page
    assert answer.status_code == 200, answer.text
    assert answer.headers["access-control-allow-origin"] == page
    assert answer.json()["choices"][0]["message"]["content"] == "device answer"
    assert evil.status_code == 403 and evil.json()["error"]["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in evil.headers
    assert len(edge.calls) == 1


def test_the_host_allowlist_admits_every_loopback_address_and_nothing_else():
    llm = HybridLLM(edge=FakeBackend(), cache=False)
    hosts = serve_hosts("0.0.0.0", ["chat.lan"])  # exposed, with names: loopback stays admitted
    with TestClient(create_app(llm, allow_hosts=hosts)) as http:
        statuses = {h: http.get("/v1/models", headers={"host": h}).status_code
                    for h in ("127.0.0.2:8080", "[::ffff:127.0.0.1]:80", "chat.lan", "localhost",
                              "127.0.0.1.evil.example", "192.168.1.9")}
    with TestClient(create_app(llm, allow_hosts=["chat.lan"])) as http:  # no loopback name given
        only_named = http.get("/v1/models", headers={"host": "127.0.0.2"}).status_code
    llm.close()
    assert statuses == {"127.0.0.2:8080": 200, "[::ffff:127.0.0.1]:80": 200, "chat.lan": 200,
                        "localhost": 200, "127.0.0.1.evil.example": 403, "192.168.1.9": 403}
    assert only_named == 403  # an embedding app's own list is kept as it is


def _start(monkeypatch, host: str) -> None:
    """``hybridllm serve --host HOST`` without a key, with the model and the server's run faked."""
    from hybridllm import _client, _serve_cli
    from hybridllm.wire import shutdown

    monkeypatch.delenv("HYBRIDLLM_SERVE_API_KEYS", raising=False)
    monkeypatch.setattr(_client, "HybridLLM", lambda **kw: HybridLLM(edge=FakeBackend(), cache=False))
    monkeypatch.setattr(shutdown.GracefulServer, "run", lambda self, sockets=None: None)
    parser = argparse.ArgumentParser()
    _serve_cli.register(parser.add_subparsers())
    assert _serve_cli.cmd_serve(parser.parse_args(["serve", "--host", host, "--port", "0"])) == 0


@pytest.mark.parametrize(("host", "warns"), [
    ("127.0.0.1", False), ("127.0.0.2", False), ("localhost", False), ("0.0.0.0", True),
])
def test_serving_without_a_key_warns_only_off_loopback(monkeypatch, capsys, host, warns):
    _start(monkeypatch, host)
    err = capsys.readouterr().err
    assert ("warning: no API key" in err) is warns, err
