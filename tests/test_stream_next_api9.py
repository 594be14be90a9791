"""Streams are iterators, as an openai or httpx stream is: ``next(llm.stream(...))`` and
``await anext(allm.stream(...))`` read a chunk (before: TypeError, "'Stream' object is not an
iterator"), a ``for`` loop after ``next()`` reads on from there, and ``with`` / ``close()`` still
stop the answer and free the device for the next request."""

from __future__ import annotations

import asyncio
import time

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM, StreamConsumedError
from hybridllm.backends.fake import FakeBackend

WORDS = "one two three four five six"


def _llm(**kw) -> HybridLLM:
    return HybridLLM(edge=FakeBackend(reply=lambda m: WORDS, **kw), cache=False)


def test_next_reads_a_chunk_and_a_for_loop_reads_on():
    with _llm() as llm:
        s = llm.stream("hi")
        first = next(s)
        assert first.text == "one"
        rest = [c.text for c in s]
        assert first.text + "".join(rest) == WORDS
        assert s.completion is not None and s.completion.text == WORDS
        with pytest.raises(StopIteration):
            next(s)
        with pytest.raises(StopIteration):  # again: an ended iterator stays ended
            next(s)
        with pytest.raises(StreamConsumedError):  # a second for loop: read once, as before
            iter(s)


def test_next_to_the_end_with_a_default():
    with _llm() as llm:
        s = llm.stream("hi")
        texts = []
        while (chunk := next(s, None)) is not None:
            texts.append(chunk.text)
        assert "".join(texts) == WORDS and s.completion is not None


def test_leaving_with_after_next_stops_the_answer_and_frees_the_device():
    with _llm(delay_s=0.2) as llm:
        with llm.stream("hi") as s:
            assert next(s).text == "one"
        start = time.monotonic()
        c = llm.chat("again", max_tokens=1)  # the device's turn was given back at close
        assert time.monotonic() - start < 1.0 and c.text == "one"
        assert llm.edge.tokens_generated < 6  # the first answer was not generated to its end
        with pytest.raises(StreamConsumedError):
            next(s)


def test_next_on_a_stream_already_read_raises():
    with _llm() as llm:
        s = llm.stream("hi")
        list(s)
        with pytest.raises(StreamConsumedError):
            next(s)


def test_anext_reads_a_chunk_and_async_for_reads_on():
    async def main() -> None:
        async with AsyncHybridLLM(edge=FakeBackend(reply=lambda m: WORDS), cache=False) as llm:
            s = llm.stream("hi")
            first = await anext(s)
            rest = [c.text async for c in s]
            assert first.text + "".join(rest) == WORDS and s.completion is not None
            with pytest.raises(StopAsyncIteration):
                await anext(s)
            async with llm.stream("hi") as s2:  # closed after one chunk: the device is free
                assert (await anext(s2)).text == "one"
            assert (await asyncio.wait_for(llm.chat("x", max_tokens=1), 5)).text == "one"
            with pytest.raises(StreamConsumedError):
                await anext(s2)

    asyncio.run(main())


@pytest.mark.real
def test_next_on_a_real_device_stream(smollm2_path):
    from hybridllm.backends.base import create_backend

    edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=256, n_threads=1)
    with HybridLLM(edge=edge, cache=False, max_tokens=8, temperature=0.0) as llm:
        whole = llm.chat("Name a colour.").text
        with llm.stream("Name a colour.") as s:
            first = next(s)
            assert whole.startswith(first.text) and first.text
        s = llm.stream("Name a colour.")
        assert next(s).text + "".join(c.text for c in s) == whole


def test_next_after_the_client_closed_half_way_says_the_client_was_closed():
    from hybridllm import HybridLLMError

    llm = _llm()
    s = llm.stream("hi")
    next(s)
    llm.close()
    with pytest.raises(HybridLLMError, match="client was closed"):
        next(s)
