"""A shutdown while a client is still sending its request body: that request ends with the grace
period (a JSON 503 server_shutting_down) and the server stops at once, rather than waiting for
uvicorn to cancel it (a plain-text 500 and a traceback, seconds later). Real uvicorn, raw socket."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
import uvicorn  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402
from hybridllm.wire.shutdown import GracefulServer  # noqa: E402

BODY = json.dumps({"model": "x", "messages": [{"role": "user", "content": "hi"}]}).encode()


def test_a_body_still_coming_in_ends_with_the_grace_period():
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "one two three"), cache=False)
    app = create_app(llm)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            timeout_graceful_shutdown=5)
    server = GracefulServer(config, app.state.drain, 0.3)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", port), timeout=15) as client:
            client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Type: application/json\r\n"
                           + f"Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY[:10])
            time.sleep(0.2)  # the request is reading its body
            start = time.monotonic()
            server.should_exit = True
            answer = client.recv(65536)
        thread.join(timeout=15)
        took = time.monotonic() - start
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        llm.close()
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), answer[:200]
    assert json.loads(rest)["error"]["code"] == "server_shutting_down"
    assert not thread.is_alive() and took < 3, f"the shutdown took {took:.1f}s"
