"""A cloud URL with ``user:password@`` (an endpoint behind basic auth): the credentials go as basic
auth and never into an endpoint's name, which errors, log lines, a completion's reason (and so
`hybridllm serve`'s reason header), stats and the refusal file quote. Before, the password was in
every one of them."""

from __future__ import annotations

import base64
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybridllm import CloudUnavailableError, GenerationParams, HybridLLM
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=8, temperature=0)
SECRET = "s3cr@t:pw"  # written percent-encoded in the URL
URL_SECRET = "s3cr%40t%3Apw"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _authorized(self) -> bool:
        want = "Basic " + base64.b64encode(f"ann:{SECRET}".encode()).decode()
        if self.headers.get("authorization") == want:
            return True
        body = json.dumps({"error": {"message": "bad credentials"}}).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return False

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if not self._authorized():
            return
        events = [{"choices": [{"delta": {"content": "fine"}, "finish_reason": None}]},
                  {"choices": [{"delta": {}, "finish_reason": "stop"}]}]
        body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()


def test_credentials_in_the_url_are_sent_as_basic_auth_and_kept_out_of_its_name(server) -> None:
    port = server.server_address[1]
    cloud = CloudBackend(base_url=f"http://ann:{URL_SECRET}@127.0.0.1:{port}", model="m", max_retries=0)
    assert "".join(d.text for d in cloud.stream(MSGS, P)) == "fine"
    assert [e.base_url for e in cloud.endpoints] == [f"http://127.0.0.1:{port}/v1"]
    assert URL_SECRET not in repr(cloud) and "ann" not in repr(cloud)
    wrong = CloudBackend(base_url=f"http://ann:nope@127.0.0.1:{port}", model="m", max_retries=0)
    with pytest.raises(Exception) as err:
        "".join(d.text for d in wrong.stream(MSGS, P))
    assert "401" in str(err.value) and "nope" not in str(err.value)


def test_a_down_cloud_behind_basic_auth_names_no_password(caplog) -> None:
    from tests.cloud_server.api.helpers import free_port

    url = f"https://ann:{URL_SECRET}@127.0.0.1:{free_port()}"  # nothing listens there
    cloud = CloudBackend(base_url=url, model="m", max_retries=0, connect_timeout_s=1)
    with caplog.at_level(logging.DEBUG, logger="hybridllm"):
        with pytest.raises(CloudUnavailableError) as err:
            "".join(d.text for d in cloud.stream(MSGS, P))
        with HybridLLM(edge=FakeBackend(reply=lambda m: "device"), cloud=cloud, cache=False) as llm:
            c = llm.chat("hi", route="cloud")
            stats = json.dumps(llm.stats())
    assert c.route.startswith("edge")
    for text in (str(err.value), c.reason, caplog.text, stats):
        assert URL_SECRET not in text and SECRET not in text, text
    assert "127.0.0.1" in str(err.value)  # the endpoint is still named, without its password
