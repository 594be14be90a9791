"""Web pages cannot use `hybridllm serve` unless the operator allows their origin.

Before: the proxy (open by default on 127.0.0.1) parsed any body as JSON whatever its content type,
so a page on any site the user visited could send it a "simple" cross-site request (``text/plain``,
no preflight, ``mode: "no-cors"``) and have it answered on the device, or force the operator's cloud
with ``"hybridllm": {"route": "cloud"}``: measured, a 200 with ``Origin: https://evil.example``.
Browsers add ``Origin``; programs (the openai client, LiteLLM, Open WebUI's backend, curl) do not.
"""

from __future__ import annotations

import argparse

import httpx
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

BODY = b'{"model": "x", "messages": [{"role": "user", "content": "hi"}]}'
EVIL = "https://evil.example"


def _post(client, origin: str | None, **headers: str):
    if origin is not None:
        headers["origin"] = origin
    return client.post("/v1/chat/completions", content=BODY,
                       headers={"content-type": "text/plain;charset=UTF-8", **headers})


def test_a_cross_site_simple_request_is_refused_on_a_real_socket():
    from tests.cloud_server.api.helpers import ThreadServer

    edge = FakeBackend(reply=lambda m: "device answer")
    llm = HybridLLM(edge=edge, cache=False)
    server = ThreadServer(create_app(llm)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            refused = _post(client, EVIL)
            models = client.get("/v1/models", headers={"origin": EVIL})
            program = _post(client, None)  # no Origin: a program, answered as before
    finally:
        server.stop()
        llm.close()
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["code"] == "origin_not_allowed" and "--allow-origin https://evil.example" in error["message"]
    assert models.status_code == 403
    assert program.status_code == 200
    assert program.json()["choices"][0]["message"]["content"] == "device answer"
    assert len(edge.calls) == 1, "the refused request reached no backend"


def test_an_allowed_origin_gets_cors_and_others_stay_refused():
    page = "https://chat.example:3000"
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "device answer"), cache=False)
    with TestClient(create_app(llm, allow_origins=[page + "/"], api_keys=["k1"])) as http:
        preflight = http.options("/v1/chat/completions", headers={
            "origin": page, "access-control-request-method": "POST",
            "access-control-request-headers": "authorization,content-type"})
        allowed = _post(http, page, authorization="Bearer k1")
        keyless = _post(http, page)
        other = _post(http, EVIL, authorization="Bearer k1")
    llm.close()
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == page
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == page
    assert "x-hybridllm-route" in allowed.headers["access-control-expose-headers"]
    assert keyless.status_code == 401  # an allowed page still needs the key
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers


def test_allow_origin_star_lets_every_page_in():
    llm = HybridLLM(edge=FakeBackend(), cache=False)
    with TestClient(create_app(llm, allow_origins=["*"])) as http:
        r = _post(http, EVIL)
    llm.close()
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"


def test_serve_passes_allow_origin_to_the_app(monkeypatch):
    from hybridllm import _client, _serve_cli
    from hybridllm.wire import shutdown

    statuses = []

    def run(self, sockets=None):  # the server's run: the app it would serve, while it is up
        # (addressed as a client of the loopback does: `testserver` is no name it answers)
        with TestClient(self.config.app, base_url="http://127.0.0.1") as http:
            statuses.extend(_post(http, o).status_code for o in ("https://chat.example:3000", EVIL))

    monkeypatch.setattr(_client, "HybridLLM", lambda **kw: HybridLLM(edge=FakeBackend(), cache=False))
    monkeypatch.setattr(shutdown.GracefulServer, "run", run)
    parser = argparse.ArgumentParser()
    _serve_cli.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--port", "0", "--no-cache",
                              "--allow-origin", "https://chat.example:3000"])
    assert _serve_cli.cmd_serve(args) == 0
    assert statuses == [200, 403]


@pytest.mark.parametrize("value", ["localhost:3000", "http://localhost:3000/app", "", "https://"])
def test_allow_origin_that_no_browser_sends_is_a_usage_error(value, capsys):
    from hybridllm import _serve_cli

    parser = argparse.ArgumentParser()
    _serve_cli.register(parser.add_subparsers())
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["serve", "--allow-origin", value])
    assert exit_.value.code == 2
    assert "expected an origin such as https://app.example:3000" in capsys.readouterr().err


def test_allow_origin_accepts_what_browsers_send():
    from hybridllm._serve_cli import web_origin

    assert web_origin("http://localhost:3000/") == "http://localhost:3000"
    assert web_origin("chrome-extension://abcdef") == "chrome-extension://abcdef"
    assert web_origin("*") == "*"


@pytest.mark.parametrize("page", ["http://localhost:3000", "http://127.0.0.1:8501", "http://[::1]:5173",
                                  "https://localhost"])
def test_a_page_served_from_this_machine_is_let_in_by_default(page):
    """A local chat UI (a page on localhost) may call the proxy without --allow-origin, as it may
    call ollama; a site's page has its own origin, whatever address it makes the browser call."""
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "device answer"), cache=False)
    with TestClient(create_app(llm)) as http:
        r = _post(http, page)
        lookalike = _post(http, "http://localhost.evil.example")
    llm.close()
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == page
    assert lookalike.status_code == 403
