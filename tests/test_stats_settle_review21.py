"""A reader that stops at the finish chunk (openai style: ``if chunk.finish_reason: break`` without
closing) has its cloud call settled in the budget by then, as stats() counts it (fast, fakes)."""

from __future__ import annotations

import asyncio

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM
from hybridllm.backends.fake import FakeBackend

SETTINGS = {"cache": False, "max_cloud_tokens_per_hour": 100_000, "threshold": 0.0}  # all to the cloud


def _parts() -> dict:
    return {"edge": FakeBackend(model="edge-m"),
            "cloud": FakeBackend(model="cloud-m", reply=lambda m: "alpha beta gamma delta")}


def _agree(stats: dict) -> None:
    budget = stats["budget"]
    assert budget["calls_in_flight"] == 0  # before: 1, holding the prompt + max_tokens estimate
    assert budget["calls_day"] == 1
    assert budget["tokens_day"] == stats["cloud_tokens"] > 0


@pytest.mark.parametrize("route", [None, "cloud"])
def test_sync_reader_stopping_at_the_finish_chunk(route):
    llm = HybridLLM(**_parts(), **SETTINGS)
    try:
        stream = llm.stream("hello there", route=route, max_tokens=5000)
        while not (chunk := next(stream)).finish_reason:
            pass
        assert chunk.completion is not None and chunk.completion.route == "cloud"
        _agree(llm.stats())  # the stream is still open here
        stream.close()
        _agree(llm.stats())  # and nothing counted twice once it closes
    finally:
        llm.close()


@pytest.mark.parametrize("route", [None, "cloud"])
def test_async_reader_stopping_at_the_finish_chunk(route):
    async def main() -> None:
        async with AsyncHybridLLM(**_parts(), **SETTINGS) as llm:
            stream = llm.stream("hello there", route=route, max_tokens=5000)
            while not (chunk := await anext(stream)).finish_reason:
                pass
            assert chunk.completion is not None and chunk.completion.route == "cloud"
            _agree(llm.stats())
            await stream.aclose()
            _agree(llm.stats())

    asyncio.run(main())


def test_a_whole_answer_is_still_counted_once():
    llm = HybridLLM(**_parts(), **SETTINGS)
    try:
        c = llm.chat("hello there")
        stats = llm.stats()
        _agree(stats)
        assert stats["cloud_tokens"] == c.usage.total_tokens
    finally:
        llm.close()
