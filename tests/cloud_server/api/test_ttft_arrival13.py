"""TTFT and end-to-end latency in /metrics count from when the server took the request up,
before its prompt was tokenized. Before, the timer started after tokenization, so a long prompt's
tokenizing (what a client waits through) was missing from the TTFT histogram."""

from __future__ import annotations

import time

import httpx

from cloud_server.api.server import create_app

from .fake_engine import FakeEngine
from .helpers import ThreadServer, metric_value

SLOW_S = 0.4


class SlowTokenizing(FakeEngine):
    def __init__(self) -> None:
        super().__init__()
        encode_chat = self.tokenizer.encode_chat

        def slow(messages, **options):
            time.sleep(SLOW_S)  # a long prompt's tokenization
            return encode_chat(messages, **options)

        self.tokenizer.encode_chat = slow


def test_ttft_counts_the_prompts_tokenization():
    engine = SlowTokenizing()
    server = ThreadServer(create_app(lambda: engine)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            r = client.post("/v1/chat/completions", json={
                "model": "fake-model", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
            assert r.status_code == 200
            text = client.get("/metrics").text
        labels = {"model": "fake-model"}
        assert metric_value(text, "hybridllm_time_to_first_token_seconds_count", **labels) == 1
        assert metric_value(text, "hybridllm_time_to_first_token_seconds_sum", **labels) >= SLOW_S
        assert metric_value(text, "hybridllm_e2e_request_latency_seconds_sum", **labels) >= SLOW_S
    finally:
        server.stop()
