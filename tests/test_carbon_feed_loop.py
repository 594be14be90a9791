"""A slow carbon-intensity feed is waited for in a worker thread, never on the event loop: in an
async app (or `hybridllm serve`) every other request and task goes on while one request's feeds
answer, and all of a request's feeds are asked at once (the slowest one's wait, not their sum)."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from hybridllm import AsyncHybridLLM
from hybridllm.backends.fake import FakeBackend
from hybridllm.carbon import CarbonPlacer, CloudEndpoint

pytest.importorskip("fastapi")

FEED_S = 0.8  # the slow feed's answer time in the event-loop test (its timeout is 1 s)


def _slow(seconds: float, value: float, calls: list[float] | None = None):
    def feed() -> float:
        if calls is not None:
            calls.append(value)
        time.sleep(seconds)  # a live grid API answering slowly
        return value

    return feed


def test_a_slow_feed_does_not_hold_the_event_loop():
    """Before: the feed was waited for inline in the cloud client's coroutine, so the loop (every
    other request of the app) stood still for the feed's whole answer time.

    The feed takes 0.8 s and the loop may stall at most half of that: waiting on the feed stalls it
    the feed's whole time, while a busy machine's scheduling does not come near it. The collector
    is off during the request (a full collection of a long suite's heap once took 0.6 s here)."""
    from cloud_server.api.server import create_app
    from tests.cloud_server.api.fake_engine import FakeEngine
    from tests.cloud_server.api.helpers import ThreadServer

    a = ThreadServer(create_app(lambda: FakeEngine(step_s=0.001))).start()
    b = ThreadServer(create_app(lambda: FakeEngine(step_s=0.001))).start()
    try:
        async def main() -> tuple[float, str | None]:
            gaps: list[float] = []
            done = asyncio.Event()

            async def ticker() -> None:
                last = time.monotonic()
                while not done.is_set():
                    await asyncio.sleep(0.01)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now

            async with AsyncHybridLLM(
                edge=FakeBackend(), cache=False, max_tokens=4, cloud_model="fake-model",
                cloud_endpoints=[CloudEndpoint(a.url, region="slow", carbon_intensity=_slow(FEED_S, 20.0)),
                                 {"url": b.url, "region": "dirty", "carbon_intensity": 700}],
            ) as llm:
                tick = asyncio.create_task(ticker())
                await asyncio.sleep(0.05)
                c = await llm.chat("summarise", route="cloud", priority="batch")
                done.set()
                await tick
            return max(gaps), c.region

        gc.collect()
        gc.disable()
        try:
            worst, region = asyncio.run(main())
        finally:
            gc.enable()
        assert region == "slow"  # the feed's figure still placed the request
        assert worst < FEED_S / 2, worst  # the loop ticked on while the feed answered
    finally:
        a.stop()
        b.stop()


def test_all_feeds_of_a_request_are_asked_at_once():
    calls: list[float] = []
    eps = [CloudEndpoint(f"http://e{i}.test", carbon_intensity=_slow(0.4, 10.0 + i, calls)) for i in range(3)]
    placer = CarbonPlacer(eps, root=lambda u: u)
    seen: dict[str, float | None] = {}
    t0 = time.monotonic()
    calls_out = placer.start_feeds()  # as the cloud client does when a request begins
    started = time.monotonic() - t0
    placer.collect_feeds(calls_out, seen)  # ... and where their figures are needed
    took = time.monotonic() - t0
    assert seen == {"http://e0.test": 10.0, "http://e1.test": 11.0, "http://e2.test": 12.0}
    assert started < 0.4, started  # no feed waited for (each takes 0.4 s)
    assert took < 1.0, took  # one after another would be 1.2 s
    assert sorted(calls) == [10.0, 11.0, 12.0]  # each feed asked once for the request
    assert placer.has_feeds
    assert not CarbonPlacer([CloudEndpoint("http://x.test", carbon_intensity=5)], root=lambda u: u).has_feeds
