"""The client's pipeline on the fake backend (fast); real-model tests are in backends/."""

import asyncio

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM, HybridLLMError, InvalidRequestError
from hybridllm.backends.fake import FakeBackend


@pytest.fixture
def llm():
    return HybridLLM(edge=FakeBackend(reply=lambda m: "one two three four five"), cache=False)


def test_chat_returns_a_completion_with_trace(llm):
    c = llm.chat("hello", max_tokens=3)
    assert c.text == "one two three"
    assert (c.route, c.model, c.finish_reason) == ("edge", "fake-model", "length")
    assert c.usage.completion_tokens == 3
    assert c.ttft_ms is not None and c.latency_ms >= c.ttft_ms


def test_stream_text_equals_chat_text(llm):
    stream = llm.stream("hello")
    text = "".join(ch.text for ch in stream)
    assert text == llm.chat("hello").text == stream.completion.text
    assert stream.completion.finish_reason == "stop"


def test_breaking_out_of_a_stream_stops_the_backend():
    backend = FakeBackend(reply=lambda m: " ".join(["w"] * 100))
    llm = HybridLLM(edge=backend, cache=False)
    for i, _ in enumerate(llm.stream("go")):
        if i == 2:
            break
    assert backend.tokens_generated <= 4


def test_bad_input_raises_at_the_call_not_mid_stream(llm):
    with pytest.raises(InvalidRequestError):
        llm.stream([])
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        llm.stream("hi", max_tokens=-5)


def test_closed_client_refuses(llm):
    llm.close()
    with pytest.raises(HybridLLMError, match="closed"):
        llm.chat("hi")


def test_async_matches_sync(llm):
    async def run():
        allm = AsyncHybridLLM.wrap(llm)
        c = await allm.chat("hello")
        chunks = [ch async for ch in allm.stream("hello")]
        return c, chunks

    c, chunks = asyncio.run(run())
    assert c.text == llm.chat("hello").text == "".join(ch.text for ch in chunks)
    assert chunks[-1].completion is not None and chunks[-1].finish_reason == "stop"


def test_async_stream_errors_propagate():
    llm = HybridLLM(edge=FakeBackend(fail=HybridLLMError("boom")), cache=False)

    async def run():
        return [ch async for ch in AsyncHybridLLM.wrap(llm).stream("x")]

    with pytest.raises(HybridLLMError, match="boom"):
        asyncio.run(run())
