"""The cloud server's body read, as the proxy's: a body that came too slowly (408) closes the
connection, and a body still coming in when the shutdown's grace period ends is answered at once
with OpenAI's 503 JSON (it held the shutdown, then got uvicorn's plain-text 500). Real uvicorn in
a thread, raw sockets, the fake engine: fast."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
import uvicorn  # noqa: E402

from cloud_server.api.server import create_app  # noqa: E402
from hybridllm.wire import body as wire_body  # noqa: E402
from hybridllm.wire.errors import WireError  # noqa: E402
from hybridllm.wire.shutdown import GracefulServer  # noqa: E402

from .fake_engine import FakeEngine  # noqa: E402
from .helpers import free_port, metric_value, wait_healthy_url  # noqa: E402

BODY = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 4}).encode()
HEAD = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\n\r\n").encode()


class _Served:
    def __init__(self, grace_s: float = 0.5) -> None:
        self.engine = FakeEngine(max_model_len=512)
        self.app = create_app(lambda: self.engine)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="critical")
        self.server = GracefulServer(config, self.app.state.server.drain, grace_s=grace_s)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_healthy_url(self.url, timeout_s=10)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@pytest.fixture
def served() -> Iterator[_Served]:
    srv = _Served()
    yield srv
    srv.stop()


def _read_answer(sock: socket.socket, wait_s: float) -> tuple[bytes, bool]:
    """What comes back within ``wait_s``, and whether the server closed the connection."""
    sock.settimeout(0.2)
    data = b""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            got = sock.recv(65536)
        except TimeoutError:
            continue
        if not got:
            return data, True
        data += got
    return data, False


def _status_headers_json(data: bytes) -> tuple[int, str, dict[str, Any]]:
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, head.decode("latin-1").lower(), json.loads(rest[rest.index(b"{"):rest.rindex(b"}") + 1])


def test_wire_error_408_hangs_up_and_keeps_given_headers() -> None:
    assert WireError("slow", status=408).headers == {"Connection": "close"}
    assert WireError("bad").headers == {}
    assert WireError("x", status=429, headers={"Retry-After": "3"}).headers == {"Retry-After": "3"}


def test_a_body_too_slow_is_a_408_that_closes_the_connection(served, monkeypatch) -> None:
    monkeypatch.setattr(wire_body, "BODY_TIMEOUT_S", 0.5)
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
        sock.sendall(HEAD + BODY[:10])
        data, closed = _read_answer(sock, wait_s=4)
    assert data, "no answer: the server still waits for the body"
    status, head, payload = _status_headers_json(data)
    assert status == 408 and payload["error"]["code"] == "request_timeout"
    assert "connection: close" in head
    assert closed  # the rest of that body is not read as the next request
    import httpx

    metrics = httpx.get(f"{served.url}/metrics").text
    assert metric_value(metrics, "hybridllm_requests_rejected_total", status="408") == 1


def test_a_body_still_coming_at_the_end_of_the_grace_period_is_a_503_at_once() -> None:
    srv = _Served(grace_s=0.5)
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
            sock.sendall(HEAD + BODY[:10])  # and the rest never (within the 60 s body deadline)
            time.sleep(0.3)
            start = time.monotonic()
            srv.server.should_exit = True  # what SIGTERM sets
            data, _ = _read_answer(sock, wait_s=4)
        assert data, "no answer at the end of the grace period: the body read held the shutdown"
        status, head, payload = _status_headers_json(data)
        assert status == 503, data
        assert payload["error"]["code"] == "server_shutting_down"
        assert time.monotonic() - start < 4
        srv.thread.join(timeout=10)
        assert not srv.thread.is_alive()
    finally:
        srv.stop()


def test_head_on_the_model_routes_answers_as_get(served) -> None:
    """RFC 9110: a GET resource answers HEAD too; HEAD /v1/models (a probe of the OpenAI API) got
    405 while /health answered it. The key is still checked, and the API document lists no HEAD."""
    import httpx

    for path in ("/v1/models", "/v1/models/fake-model"):
        get, head = httpx.get(served.url + path), httpx.head(served.url + path)
        assert head.status_code == get.status_code == 200, (path, head.status_code)
        assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"]
    assert httpx.head(served.url + "/v1/models/other").status_code == 404
    doc = httpx.get(served.url + "/openapi.json").json()
    assert all("head" not in ops for ops in doc["paths"].values())

    from fastapi.testclient import TestClient

    with TestClient(create_app(lambda: FakeEngine(), api_keys=["k"])) as client:
        assert client.head("/v1/models").status_code == 401


def test_a_request_arriving_while_closing_is_refused_before_its_body(served, monkeypatch) -> None:
    """Admission closed: a new request whose body comes slowly waited for it (held the drain up to
    the grace period, or got a 408) before its 503; now it is refused at once, as the proxy does."""
    monkeypatch.setattr(wire_body, "BODY_TIMEOUT_S", 3.0)
    served.app.state.server.drain.is_closing = True
    for path in (b"/v1/chat/completions", b"/v1/completions"):
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
            sock.sendall(HEAD.replace(b"/v1/chat/completions", path) + BODY[:10])
            data, _ = _read_answer(sock, wait_s=1.5)  # the body's deadline is 3 s
        assert data, "no answer: the server waits for the body of a request it will refuse"
        status, _, payload = _status_headers_json(data)
        assert (status, payload["error"]["code"]) == (503, "server_shutting_down")
