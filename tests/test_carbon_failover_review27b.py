"""CO2 saved is counted against an endpoint that could answer, not one that failed the request.

``co2_saved_g`` is a cloud answer's CO2 at the fastest endpoint's grid intensity less its own.
Before: the fastest was taken when the request started; an endpoint not measured yet ranks
fastest (it is explored first), so a clean endpoint that answered every request with HTTP 500
stayed the baseline. Each answer the dirty endpoint gave in its place, an interactive one too
(which by definition went where always using the fastest would have gone), read as CO2 lost
against the failing one: ``co2_saved_g`` < 0, in the answer and summed in ``stats()``. Now a
fastest endpoint that failed the request gives way to the fastest of those that did not fail.
Real HTTP: two small servers, as in test_cloud_slow_reader_review27b.
"""

from __future__ import annotations

import json

import pytest

from hybridllm import HybridLLM
from hybridllm.backends.fake import FakeBackend
from hybridllm.carbon import J_PER_KWH

from .test_cloud_slow_reader_review27b import Server, respond, sse, stream_head, text_event
from .test_combinations import CloudRouter


async def _failing(reader, writer, server) -> None:
    respond(writer, 500, json.dumps({"error": {"message": "boom"}}).encode())


async def _answering(reader, writer, server) -> None:
    stream_head(writer)
    writer.write(text_event("hi ") + text_event("there", finish="stop"))
    # our server's own energy figure: 36 J
    writer.write(sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                                               "energy": {"joules": 36.0, "source": "server"}}}))
    writer.write(b"data: [DONE]\n\n")


@pytest.mark.parametrize("priority", ["interactive", "batch"])
def test_an_answer_from_the_dirty_grid_while_the_clean_one_fails_saves_nothing_not_less(priority):
    clean, dirty = Server(_failing), Server(_answering)
    llm = HybridLLM(edge=FakeBackend(), policy=CloudRouter(), cache=False, cloud_max_retries=2,
                    cloud_breaker_threshold=10, cloud_endpoints=[
                        {"url": clean.url, "region": "clean", "carbon_intensity": 10},
                        {"url": dirty.url, "region": "dirty", "carbon_intensity": 500}])
    try:
        answers = [llm.chat("hi", priority=priority) for _ in range(2)]
        stats = llm.stats()
    finally:
        llm.close()
        clean.stop()
        dirty.stop()
    assert len(clean.posts) == 2 and len(dirty.posts) == 2  # each request: the clean one failed first
    for c in answers:
        assert c.route == "cloud" and c.region == "dirty"
        assert c.co2_g == pytest.approx(36.0 / J_PER_KWH * 500)
        # before: 36 J at 10 g/kWh less at 500 g/kWh, -0.0049 g, against the endpoint that failed
        assert c.co2_saved_g == 0.0
    assert stats["co2_saved_g"] == 0.0
