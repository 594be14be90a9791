"""An interactive request is sent without waiting for the endpoints' carbon-intensity feeds: their
figures only account it (its CO2), they do not place it, so they are read when its answer ends. A
batch request, placed by the figures, still waits for them (httpx.MockTransport, no network).

Before, every request waited for the feeds (up to their 1 s timeout) before it was sent. The test
shows the order without timing: the feed answers only once the request has reached the server, so
a request that waited for the feed first found it timed out (its figure unknown, co2_g None)."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest

from hybridllm import GenerationParams
from hybridllm.backends.cloud import CloudBackend
from hybridllm.carbon import J_PER_KWH, CloudEndpoint

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=8)
JOULES = 36000.0
SSE = "data: " + json.dumps({
    "choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "energy": {"joules": JOULES, "source": "rapl"}},
}) + "\n\ndata: [DONE]\n\n"


def _run(priority: str | None):
    arrived = threading.Event()

    def feed() -> float:
        arrived.wait(timeout=5)  # a grid API that answers once the request is out
        return 200.0

    def handler(request):
        arrived.set()
        return httpx.Response(200, text=SSE, headers={"content-type": "text/event-stream"})

    cloud = CloudBackend(base_url=[], model="m", transport=httpx.MockTransport(handler),
                         remember_refusals=False,
                         carbon=[CloudEndpoint("http://a.test/v1", region="a", carbon_intensity=feed)])

    async def run():
        last = None
        async for delta in cloud.astream(MSGS, P, priority=priority):
            last = delta
        return last.usage

    return asyncio.run(run())


@pytest.mark.parametrize("priority", [None, "interactive"])
def test_an_interactive_request_does_not_wait_for_the_feeds_before_it_is_sent(priority):
    usage = _run(priority)
    assert usage.region == "a"
    assert usage.co2_g == pytest.approx(JOULES / J_PER_KWH * 200.0)  # before: None (timed out)
    assert usage.co2_saved_g == 0.0


def test_a_batch_request_still_waits_for_the_feeds_that_place_it():
    usage = _run("batch")  # the feed cannot answer before the request is out: unknown, as before
    assert usage.region == "a" and usage.co2_g is None
