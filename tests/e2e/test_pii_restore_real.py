"""privacy="redact" end to end: the real device model and router, a real cloud server process, and
a recording relay between them that keeps what went over the wire each way."""

from __future__ import annotations

import http.server
import json
import threading

import httpx
import pytest

from hybridllm import HybridLLM
from hybridllm.cache import SemanticCache

pytestmark = pytest.mark.real

JANE, BOB = "jane.doe@example.com", "bob.smith@example.org"
# SmolLM2 repeats a short line it is asked to repeat: the placeholders come back in its answer
PROMPT = f"Repeat this line exactly: Contact {JANE} or {BOB}."


class _Relay(http.server.ThreadingHTTPServer):
    """Forwards to the cloud and records each chat request's body and the text the cloud streamed."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.requests: list[bytes] = []
        self.answers: list[str] = []
        super().__init__(("127.0.0.1", 0), _RelayHandler)


class _RelayHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        srv: _Relay = self.server  # type: ignore[assignment]
        r = httpx.get(srv.upstream + self.path, timeout=60)
        self.send_response(r.status_code)
        self.send_header("content-type", r.headers.get("content-type", "application/json"))
        self.end_headers()
        self.wfile.write(r.content)

    def do_POST(self):
        srv: _Relay = self.server  # type: ignore[assignment]
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        srv.requests.append(body)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        text = []
        with httpx.stream("POST", srv.upstream + self.path, content=body, timeout=120,
                          headers={"content-type": "application/json"}) as r:
            for line in r.iter_lines():
                self.wfile.write((line + "\n").encode())
                if line.startswith("data:") and not line.endswith("[DONE]"):
                    choices = json.loads(line[5:]).get("choices") or [{}]
                    text.append((choices[0].get("delta") or {}).get("content") or "")
        srv.answers.append("".join(text))
        self.wfile.flush()


@pytest.fixture
def relay(cloud):
    server = _Relay(cloud.url)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def test_the_cloud_sees_numbered_placeholders_and_the_user_the_values(relay, tmp_path):
    cache = SemanticCache(tmp_path / "cache.sqlite", store_pii=True)
    url = f"http://127.0.0.1:{relay.server_address[1]}"
    # threshold 0: the real router sends every prompt to the cloud
    with HybridLLM(cloud_url=url, cache=cache, privacy="redact", threshold=0.0, n_ctx=2048,
                   cloud_max_retries=0, temperature=0.0, max_tokens=32) as llm:
        stream = llm.stream(PROMPT)
        chunks = [ch.text for ch in stream]
        c = stream.completion
        again = llm.chat(PROMPT)
    assert c is not None and c.route == "cloud" and "email redacted for the cloud" in c.reason

    # what went over the wire: two distinct placeholders, no address, no map
    assert len(relay.requests) == 1
    sent = json.loads(relay.requests[0])
    wire = relay.requests[0].decode()
    assert sent["messages"][-1]["content"] == "Repeat this line exactly: Contact [EMAIL_1] or [EMAIL_2]."
    assert "jane" not in wire and "bob" not in wire and "example." not in wire

    # what the cloud said holds placeholders; what the user got holds the addresses instead
    raw = relay.answers[0]
    assert "[EMAIL_1]" in raw and "[EMAIL_2]" in raw, raw
    expected = raw.replace("[EMAIL_1]", JANE).replace("[EMAIL_2]", BOB)
    assert c.text == expected and "".join(chunks) == expected
    assert not any("EMAIL" in ch for ch in chunks), chunks

    # the cache kept the restored answer, keyed by the original prompt on the device
    assert again.route == "cache" and again.text == expected and len(relay.requests) == 1
