"""An ``async def`` carbon-intensity feed (review 28).

Before: the feed's coroutine was taken as its figure, not a number, so the endpoint's intensity was
unknown on every request (ranked last for batch requests, no CO2 figures), with a warning quoting
"<coroutine object ...>" and Python's "coroutine was never awaited". Now it is awaited, in the
feed's worker thread, under the same timeout as a plain feed."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from hybridllm import HybridLLM
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend
from hybridllm.carbon import J_PER_KWH, CloudEndpoint

SSE = ('data: {"choices":[{"delta":{"content":"an answer"},"finish_reason":"stop"}],'
       '"usage":{"prompt_tokens":6,"completion_tokens":4,"energy":{"joules":3600,"source":"rapl"}}}\n\n'
       'data: [DONE]\n\n')


async def _clean_grid() -> float:
    await asyncio.sleep(0)  # a real feed awaits its HTTP call
    return 20.0


def test_an_async_feed_gives_its_figure(caplog):
    ep = CloudEndpoint("http://a.test/v1", carbon_intensity=_clean_grid)
    with caplog.at_level(logging.WARNING, logger="hybridllm.carbon"):
        assert ep.intensity() == 20.0
    assert not caplog.records


def test_a_failing_async_feed_is_unknown_and_named(caplog):
    async def down() -> float:
        raise ConnectionError("grid API down")

    ep = CloudEndpoint("http://a.test/v1", carbon_intensity=down)
    with caplog.at_level(logging.WARNING, logger="hybridllm.carbon"):
        assert ep.intensity() is None
    assert "ConnectionError: grid API down" in caplog.text


def test_a_batch_request_goes_to_the_grid_an_async_feed_says_is_cleanest():
    hosts = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        hosts.append(request.url.host)
        return httpx.Response(200, text=SSE, headers={"content-type": "text/event-stream"})

    cloud = CloudBackend(base_url=[], transport=httpx.MockTransport(handler), model="m",
                         max_retries=0, remember_refusals=False,
                         carbon=[{"url": "http://dirty.test/v1", "region": "dirty", "carbon_intensity": 400},
                                 {"url": "http://clean.test/v1", "region": "clean",
                                  "carbon_intensity": _clean_grid}])
    with HybridLLM(edge=FakeBackend(), cloud=cloud, cache=False) as llm:
        c = llm.chat("summarise", route="cloud", priority="batch")
        assert hosts == ["clean.test"] and c.region == "clean"
        assert c.co2_g == pytest.approx(3600 / J_PER_KWH * 20)
        assert c.co2_saved_g == pytest.approx(3600 / J_PER_KWH * (400 - 20))  # dirty is the fastest
