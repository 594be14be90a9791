"""One cloud call's accounting with the real SmolLM2 on the device (llama.cpp) and a real HTTP cloud
on loopback that speaks the OpenAI event stream and misbehaves on purpose: it breaks off inside a
placeholder (privacy="redact"), or takes a request and stays silent until the caller gives up.
The fast versions on fakes are in tests/test_cloud_accounting.py."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM
from hybridllm.router import RoutingPolicy

from ..test_pii_restore import HardRouter

pytestmark = pytest.mark.real

JANE = "jane.doe@example.com"
PROMPT = f"Repeat this line exactly: Contact {JANE}."
PRICE = 0.002  # per 1k tokens
# what the cloud streams before its connection drops: the end is half of the placeholder
PIECES = ["Sure. I will write to ", "[EMA"]


class _Cloud(http.server.ThreadingHTTPServer):
    """``/break/v1``: streams PIECES and closes the connection without a finish or [DONE];
    ``/silent/v1``: reads the request and sends nothing until ``go`` is set."""

    daemon_threads = True

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.received = threading.Event()
        self.go = threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{mode}"


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # /<mode>/v1/models
        body = json.dumps({"data": [{"id": "loopback-model"}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        srv: _Cloud = self.server  # type: ignore[assignment]
        srv.bodies.append(json.loads(self.rfile.read(int(self.headers.get("content-length") or 0))))
        srv.received.set()
        if self.path.startswith("/silent/"):
            srv.go.wait(60)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for piece in PIECES:
            event = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        # HTTP/1.0: returning closes the connection mid-answer


@pytest.fixture
def loopback():
    server = _Cloud()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.go.set()
    server.shutdown()
    server.server_close()


def _client(smollm2_path, url: str) -> HybridLLM:
    from hybridllm.backends.base import create_backend

    edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=512, n_threads=1)
    return HybridLLM(edge=edge, cloud_url=url, policy=RoutingPolicy(HardRouter(), privacy="redact"),
                     cache=False, max_tokens=12, temperature=0.0, cloud_max_retries=0,
                     price_per_1k_tokens=PRICE, max_cloud_tokens_per_day=100_000)


def test_real_device_finishes_a_stream_broken_inside_a_placeholder_and_each_count_says_what_it_names(
        smollm2_path, loopback):
    with _client(smollm2_path, loopback.url("break")) as llm:
        n = llm.edge.count_tokens([{"role": "user", "content": PROMPT}])
        stream = llm.stream(PROMPT)
        texts = [ch.text for ch in stream]
        c = stream.completion
        s = llm.stats()
    assert c is not None and c.route == "cloud->edge", c
    # half a placeholder never reaches the caller; the device wrote on from the text shown
    assert "[EMA" not in "".join(texts) and "EMAIL" not in c.text and "".join(texts) == c.text
    assert c.text.startswith("Sure. I will write to ") and len(c.text) > len("Sure. I will write to ")
    assert JANE not in json.dumps(loopback.bodies) and "[EMAIL_1]" in json.dumps(loopback.bodies)
    # as the cloud sent it, ~4 characters a token rounded up: 22 and 4 characters
    streamed = 6 + 1
    # the ledger, the stats and the cost: the cloud call alone (the prompt plus what it streamed)
    assert s["budget"]["tokens_day"] == n + streamed and s["budget"]["calls_in_flight"] == 0
    assert s["cloud_tokens"] == n + streamed
    assert c.cost_usd == pytest.approx((n + streamed) / 1000 * PRICE)
    # the answer the caller got: the prompt once, the cloud's part and the device's as completion
    assert c.usage.prompt_tokens == n and c.usage.completion_tokens > streamed


def test_real_device_counts_a_cloud_call_cancelled_before_its_first_token(smollm2_path, loopback):
    with _client(smollm2_path, loopback.url("silent")) as llm:
        n = llm.edge.count_tokens([{"role": "user", "content": "Say hi."}])

        async def run() -> None:
            task = asyncio.ensure_future(AsyncHybridLLM.wrap(llm).chat("Say hi."))
            while not loopback.received.is_set():
                await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(run())
        usage = llm.stats()["budget"]
    # the request reached the cloud, which read the prompt: it counts, and nothing stays held
    assert usage["calls_day"] == 1 and usage["tokens_day"] == n and usage["calls_in_flight"] == 0
