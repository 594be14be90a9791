"""A cloud URL with a query string (Azure's ``?api-version=``, a gateway's ``?key=``): its
parameters go with each request, and the endpoint is named without them. Before, the query stayed
in the path (``/v1?api-version=1/v1/chat/completions``): every request went to a wrong path."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from hybridllm import GenerationParams
from hybridllm.backends.cloud import CloudBackend

SEEN: list[tuple[str, dict]] = []


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        parts = urlsplit(self.path)
        SEEN.append((parts.path, parse_qs(parts.query)))
        if parts.path != "/openai/v1/chat/completions":
            body, status = json.dumps({"error": {"message": f"no route {parts.path}"}}).encode(), 404
            ctype = "application/json"
        else:
            events = [{"choices": [{"delta": {"content": "fine"}, "finish_reason": None}]},
                      {"choices": [{"delta": {}, "finish_reason": "stop"}]}]
            body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
            status, ctype = 200, "text/event-stream"
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def server():
    SEEN.clear()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()


@pytest.mark.parametrize("tail", ["/openai?api-version=2024-10-21&key=S3CRET",
                                  "/openai/v1/?api-version=2024-10-21&key=S3CRET"])
def test_a_query_string_goes_with_each_request_and_not_in_the_name(server, tail) -> None:
    port = server.server_address[1]
    cloud = CloudBackend(base_url=f"http://127.0.0.1:{port}{tail}", model="m", max_retries=0)
    assert [e.base_url for e in cloud.endpoints] == [f"http://127.0.0.1:{port}/openai/v1"]
    text = "".join(d.text for d in cloud.stream([{"role": "user", "content": "hi"}],
                                                GenerationParams(max_tokens=4, temperature=0)))
    assert text == "fine"
    assert SEEN == [("/openai/v1/chat/completions", {"api-version": ["2024-10-21"], "key": ["S3CRET"]})]
    assert "S3CRET" not in repr(cloud)
