"""`hybridllm serve` answers while its model loads: /health (and HEAD) a 503 ``{"status": "loading"}``
and any other request OpenAI's 503 ``model_not_ready``, at once, each with Retry-After, as the cloud
server does. Before, the port was bound but nothing answered until the model had loaded: a health
probe or a chat UI's model list hung for the whole load (minutes for a first download)."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

pytest.importorskip("uvicorn")

from hybridllm import HybridLLM, cli  # noqa: E402
from hybridllm._cli_options import listen as real_listen  # noqa: E402
from hybridllm._exceptions import ConfigError  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402

BODY = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no config.toml of the machine's
    monkeypatch.delenv("HYBRIDLLM_CONFIG", raising=False)
    monkeypatch.delenv("HYBRIDLLM_SERVE_API_KEYS", raising=False)


def _bound(monkeypatch) -> list:
    socks: list = []

    def listen(host, port, error):
        socks.append(real_listen(host, port, error))
        return socks[-1]

    monkeypatch.setattr("hybridllm._serve_cli.listen", listen)
    return socks


def _probe(port: int) -> dict:
    """What a client gets from each endpoint within 3 s (an exception's name if nothing)."""
    seen: dict = {}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=3) as client:
        for name, method, path, kw in [
            ("health", "GET", "/health", {}),
            ("head", "HEAD", "/health", {}),
            ("models", "GET", "/v1/models", {"headers": {"x-request-id": "probe-1"}}),
            ("chat", "POST", "/v1/chat/completions", {"json": BODY}),
        ]:
            try:
                seen[name] = client.request(method, path, **kw)
            except httpx.HTTPError as exc:
                seen[name] = type(exc).__name__
    return seen


def test_requests_during_the_load_get_a_503_loading_at_once(monkeypatch, clean_env):
    socks = _bound(monkeypatch)
    seen: dict = {}

    def loading(**kw):  # the load: the probes run while it lasts, then it fails
        seen.update(_probe(socks[0].getsockname()[1]))
        raise ConfigError("Unknown model 'nosuch'.")

    monkeypatch.setattr("hybridllm._client.HybridLLM", loading)
    assert cli.main(["serve", "--port", "0"]) == 1
    assert socks[0].fileno() == -1  # closed afterwards, as before
    health = seen["health"]
    assert not isinstance(health, str), f"/health during the load: {health}"
    assert health.status_code == 503 and health.json() == {"status": "loading"}
    assert health.headers["retry-after"] == "5"
    assert seen["head"].status_code == 503 and seen["head"].content == b""
    for name in ("models", "chat"):
        r = seen[name]
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json()["error"]["code"] == "model_not_ready"
        assert r.json()["error"]["message"] == "The model is still loading; retry shortly."
    assert seen["models"].headers["x-request-id"] == "probe-1"
    assert seen["chat"].headers["x-request-id"]  # a new one, as every answer of the proxy


def test_the_loading_answers_stop_before_the_app_serves(monkeypatch, clean_env):
    socks = _bound(monkeypatch)
    at_serve: dict = {}

    def run(self, sockets=None):
        names = {t.name for t in threading.enumerate()}
        at_serve["loading_thread"] = "hybridllm-serve-loading" in names
        at_serve["socket_open"] = sockets[0].fileno() != -1

    monkeypatch.setattr("hybridllm._client.HybridLLM",
                        lambda **kw: HybridLLM(edge=FakeBackend(), cache=False))
    monkeypatch.setattr("hybridllm.wire.shutdown.GracefulServer.run", run)
    assert cli.main(["serve", "--port", "0"]) == 0
    # uvicorn gets the socket open, and nothing else answers on it any more
    assert at_serve == {"loading_thread": False, "socket_open": True}
    assert socks[0].fileno() == -1


def test_a_request_body_is_read_so_the_503_is_not_lost_in_a_reset():
    from hybridllm._serve_loading import LoadingAnswers

    sock = real_listen("127.0.0.1", 0, ConfigError)
    try:
        with LoadingAnswers(sock, 4 * 1024 * 1024):
            body = json.dumps({**BODY, "pad": "x" * 200_000}).encode()
            r = httpx.post(f"http://127.0.0.1:{sock.getsockname()[1]}/v1/chat/completions",
                           content=body, headers={"content-type": "application/json"}, timeout=3)
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"
        assert r.headers["connection"] == "close"
    finally:
        sock.close()
