"""HTTP 422 from the cloud, over real HTTP on loopback. Before, every 422 was read as "request not
processable": a window refusal, so a prompt too long for the device raised
ContextWindowExceededError ("the cloud refuses it too ... shorten the conversation") whatever the
server said, and one that fits was answered on the device, hiding a request error. Now a 422 is
a window refusal only when its body says the context / maximum length was exceeded (TGI's
"`inputs` tokens + `max_new_tokens` must be <= 2048", a context_length_exceeded code); any other
422 is an InvalidRequestError that quotes the server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybridllm import ContextWindowExceededError, HybridLLM, InvalidRequestError
from hybridllm.backends.fake import FakeBackend

FALLBACK = "edge (cloud unavailable)"
BODIES = {
    # FastAPI / pydantic validation of a field: the request's fault, not the prompt's length
    "pydantic": {"detail": [{"type": "less_than_equal", "loc": ["body", "max_tokens"],
                             "msg": "Input should be less than or equal to 4096", "input": 9000}]},
    # Hugging Face TGI's answer to a prompt past its window
    "tgi": {"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 2048. "
                     "Given: 3000 `inputs` tokens and 8 `max_new_tokens`", "error_type": "validation"},
    "code": {"error": {"message": "prompt too big for this deployment", "code": "context_length_exceeded"}},
}


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        mode = self.path.split("/")[1]
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.hits.append(mode)  # type: ignore[attr-defined]
        data = json.dumps(BODIES[mode]).encode()
        self.send_response(422)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.hits = []  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _llm(server, mode: str, context_length: int = 4096) -> HybridLLM:
    url = f"http://127.0.0.1:{server.server_address[1]}/{mode}/v1"
    device = FakeBackend(reply=lambda m: "from the device", context_length=context_length)
    return HybridLLM(edge=device, cloud_url=url, cloud_model="m", cache=False, cloud_max_retries=0)


def test_a_422_that_is_a_validation_error_is_the_requests_error_quoting_the_server(server):
    with _llm(server, "pydantic") as llm:
        with pytest.raises(InvalidRequestError) as info:
            llm.chat("hi", route="cloud")
        assert "HTTP 422" in str(info.value) and "less than or equal to 4096" in str(info.value)
        assert llm.cloud.endpoints[0].breaker.state == "closed"
    assert server.hits == ["pydantic"]  # not retried


def test_a_422_validation_error_for_a_long_prompt_is_not_called_a_context_window(server):
    with _llm(server, "pydantic", context_length=4) as llm:
        with pytest.raises(InvalidRequestError) as info:
            llm.chat("a prompt longer than the device holds")
    assert not isinstance(info.value, ContextWindowExceededError), info.value
    assert "less than or equal to 4096" in str(info.value)


@pytest.mark.parametrize("mode", ["tgi", "code"])
def test_a_422_that_says_the_window_is_exceeded_is_a_window_refusal(server, mode):
    with _llm(server, mode) as llm:  # the prompt fits the device: it answers
        c = llm.chat("hi", route="cloud")
    assert (c.text, c.route) == ("from the device", FALLBACK) and "HTTP 422" in c.reason
    with _llm(server, mode, context_length=4) as llm:  # it does not: only a shorter prompt helps
        with pytest.raises(ContextWindowExceededError, match="refuses it too"):
            llm.chat("a prompt longer than the device holds")
