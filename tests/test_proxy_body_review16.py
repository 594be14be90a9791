"""A request body that never comes whole (a trickle, or a Content-Length never sent) is a 408
within the body deadline, on both servers that read bodies with ``hybridllm.wire.body``; real
uvicorn, raw sockets (fast: fake backends, a deadline shortened to half a second)."""

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

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402
from hybridllm.wire import body as wire_body  # noqa: E402

DEADLINE_S = 0.5
BODY = json.dumps({"model": "x", "messages": [{"role": "user", "content": "hi"}]}).encode()


class _Server:
    def __init__(self, app: Any) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(autouse=True)
def _short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire_body, "BODY_TIMEOUT_S", DEADLINE_S, raising=False)


@pytest.fixture
def proxy() -> Iterator[_Server]:
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "one two three"), cache=False)
    srv = _Server(create_app(llm))
    yield srv
    srv.stop()
    llm.close()


@pytest.fixture
def cloud() -> Iterator[_Server]:
    pytest.importorskip("cloud_server")
    from cloud_server.api.server import create_app as cloud_app

    from .cloud_server.api.fake_engine import FakeEngine

    engine = FakeEngine(max_num_seqs=4, max_waiting=8, max_model_len=512)
    srv = _Server(cloud_app(lambda: engine))
    # the fake engine loads in the lifespan: wait until /health says so
    deadline = time.monotonic() + 10
    while b" 200 " not in _exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")[0]:
        assert time.monotonic() < deadline, "cloud server not healthy"
        time.sleep(0.05)
    yield srv
    srv.stop()


def _exchange(port: int, head: bytes, body: bytes = b"", wait_s: float = 5.0) -> tuple[bytes, bool]:
    """Send ``head`` + ``body`` and then nothing; (what came back, whether the server closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(head + body)
        data = b""
        closed = False
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                got = sock.recv(65536)
            except TimeoutError:
                break
            if not got:
                closed = True
                break
            data += got
            if b"\r\n\r\n" in data and data.endswith(b"}") and not head.startswith(b"POST"):
                break
        return data, closed


def _post_head(length: int | None) -> bytes:
    size = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\n{size}\r\n\r\n").encode()


def _status_and_json(data: bytes) -> tuple[int, dict]:
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(rest[rest.index(b"{"):rest.rindex(b"}") + 1])


@pytest.mark.parametrize("sent", [0, 10], ids=["nothing", "part"])
def test_proxy_body_never_sent_whole_is_a_408_and_the_connection_closes(proxy, sent):
    start = time.monotonic()
    data, closed = _exchange(proxy.port, _post_head(len(BODY)), BODY[:sent])
    assert data, "no answer: the server still waits for the body"
    status, payload = _status_and_json(data)
    assert status == 408 and payload["error"]["code"] == "request_timeout"
    assert "0.5 seconds" in payload["error"]["message"]
    assert time.monotonic() - start < 4
    assert closed  # the rest of the body is not waited for


def test_proxy_chunked_trickle_is_a_408(proxy):
    data, _ = _exchange(proxy.port, _post_head(None), b"5\r\n{\"mod\r\n")
    assert data and _status_and_json(data)[0] == 408


def test_proxy_body_sent_in_time_is_answered(proxy):
    data, _ = _exchange(proxy.port, _post_head(len(BODY)) + b"", BODY, wait_s=2)
    assert b" 200 " in data.split(b"\r\n", 1)[0] and b"one two three" in data


def test_cloud_server_body_never_sent_whole_is_a_408(cloud):
    data, _ = _exchange(cloud.port, _post_head(len(BODY)), BODY[:10])
    assert data, "no answer: the server still waits for the body"
    status, payload = _status_and_json(data)
    assert status == 408 and payload["error"]["code"] == "request_timeout"
