"""CO2 saved is counted against the endpoint "always the fastest" would have used for this very
request, chosen when the request is placed (httpx.MockTransport, no network).

Before, the baseline was the fastest endpoint when the request began, so an interactive request
(placed, by definition, where always using the fastest places it) read as CO2 lost
(``co2_saved_g`` < 0) when
- the fastest was waiting out a Retry-After from an earlier request, and it went elsewhere;
- two requests began together, both saw A fastest, and the second was balanced onto B.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from hybridllm import GenerationParams
from hybridllm.backends.cloud import CloudBackend
from hybridllm.carbon import J_PER_KWH

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=8)
JOULES = 36000.0  # 0.01 kWh: 1 g at 100 g/kWh, 5 g at 500
SSE = "data: " + json.dumps({
    "choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "energy": {"joules": JOULES, "source": "rapl"}},
}) + "\n\ndata: [DONE]\n\n"


def _answer() -> httpx.Response:
    return httpx.Response(200, text=SSE, headers={"content-type": "text/event-stream"})


def _backend(handler, b_intensity=500) -> CloudBackend:
    return CloudBackend(base_url=[], model="m", transport=httpx.MockTransport(handler),
                        backoff_base_s=0, max_retries=2, remember_refusals=False,
                        carbon=[{"url": "http://a.test/v1", "region": "a", "carbon_intensity": 100},
                                {"url": "http://b.test/v1", "region": "b",
                                 "carbon_intensity": b_intensity}])


def _last(backend: CloudBackend, priority: str):
    async def run():
        last = None
        async for delta in backend.astream(MSGS, P, priority=priority):
            last = delta
        return last.usage

    return asyncio.run(run())


def test_an_interactive_answer_while_the_fastest_waits_out_a_retry_after_saves_nothing():
    hosts: list[str] = []

    def handler(request):
        hosts.append(request.url.host)
        if request.url.host == "a.test" and hosts.count("a.test") == 1:
            return httpx.Response(429, headers={"retry-after": "120"}, json={"error": {"message": "slow"}})
        return _answer()

    cloud = _backend(handler)
    first, second = _last(cloud, "interactive"), _last(cloud, "interactive")
    assert hosts == ["a.test", "b.test", "b.test"]  # A is left alone for its 120 s
    for usage in (first, second):
        assert usage.region == "b" and usage.co2_g == pytest.approx(JOULES / J_PER_KWH * 500)
        assert usage.co2_saved_g == 0.0  # before, the second: -4.0 (against A, held back)


def test_two_interactive_requests_balanced_onto_two_endpoints_save_nothing():
    def handler(request):
        return _answer()

    cloud = _backend(handler, b_intensity=lambda: 500)  # a feed: both wait for it, then are placed

    async def one():
        last = None
        async for delta in cloud.astream(MSGS, P, priority="interactive"):
            last = delta
        return last.usage

    async def both():
        return await asyncio.gather(one(), one())

    usages = asyncio.run(both())  # one event loop: the backend's client is per loop
    assert sorted(u.region for u in usages) == ["a", "b"]  # the second balanced onto B
    assert [u.co2_saved_g for u in usages] == [0.0, 0.0]  # before, B's: -4.0


def test_a_batch_answer_still_saves_against_the_fastest_it_could_have_used():
    """Batch goes to the cleanest grid; its saving is counted against the fastest endpoint (B,
    measured faster), not against itself."""
    def handler(request):
        return _answer()

    cloud = _backend(handler)
    cloud.placer.observe_ttft("http://b.test/v1", 0.01)
    cloud.placer.observe_ttft("http://a.test/v1", 5.0)
    usage = _last(cloud, "batch")
    assert usage.region == "a"
    assert usage.co2_saved_g == pytest.approx(JOULES / J_PER_KWH * (500 - 100))
