"""`hybridllm serve`'s /openapi.json lists the 408 its chat route answers to a body that does not
arrive whole in time (code request_timeout). Before, the route answered it and the document left
it out, so a client generated from the document did not expect it. The 408 is produced by a real
slow body on a real socket, then looked up in the document the same server serves."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

pytest.importorskip("fastapi")
from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402
from hybridllm.wire import body as wire_body  # noqa: E402
from tests.cloud_server.api.helpers import ThreadServer  # noqa: E402


def test_a_slow_body_is_a_408_and_the_document_lists_it(monkeypatch):
    monkeypatch.setattr(wire_body, "BODY_TIMEOUT_S", 0.3)
    llm = HybridLLM(edge=FakeBackend(), cache=False)
    server = ThreadServer(create_app(llm)).start()
    try:
        body = json.dumps({"model": "x", "messages": [{"role": "user", "content": "hi"}]}).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(head + body[:10])  # and the rest never
            answer = b""
            while chunk := sock.recv(65536):  # to the end: a 408 closes the connection
                answer += chunk
        doc = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
    finally:
        server.stop()
        llm.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
    assert b"request_timeout" in answer
    responses = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert "request_timeout" in responses["408"]["description"], sorted(responses)
    assert "408" not in doc["paths"]["/v1/models"]["get"]["responses"]  # a GET reads no body
