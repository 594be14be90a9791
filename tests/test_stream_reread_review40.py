"""A stream read again says why it cannot be: cut off, or read to its end (review 40).

Iterated again after a ``break`` (or a ``close()``) half way, a stream said it "was already read
(or closed)" and, the sync one, to "read .completion", which is None for an answer cut off: now it
says the answer was closed before it was complete (or, an async loop left a moment ago, that it was
left half way) and to call stream() again. The async stream read
again to its end said no more than "already read": it now tells what to do, as the sync one does.
"""

from __future__ import annotations

import asyncio

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM, StreamConsumedError
from hybridllm.backends.fake import FakeBackend


def _edge() -> FakeBackend:
    return FakeBackend(reply=lambda m: "one two three four five")


def test_a_sync_stream_left_half_way_says_it_was_cut_off_when_read_again() -> None:
    with HybridLLM(edge=_edge(), cache=False) as llm:
        stream = llm.stream("hi")
        for _ in stream:
            break
        assert stream.completion is None
        with pytest.raises(StreamConsumedError) as err:
            list(stream)
        said = str(err.value)
        assert "closed before its answer was complete" in said and "call stream() again" in said
        assert ".completion" not in said  # there is none to read


def test_a_sync_stream_closed_before_reading_says_so() -> None:
    with HybridLLM(edge=_edge(), cache=False) as llm:
        stream = llm.stream("hi")
        stream.close()
        with pytest.raises(StreamConsumedError, match="closed before its answer was complete"):
            list(stream)


def test_an_async_stream_left_half_way_says_it_was_cut_off_when_read_again() -> None:
    async def main() -> str:
        async with AsyncHybridLLM(edge=_edge(), cache=False) as llm:
            stream = llm.stream("hi")
            async for _ in stream:
                break
            assert stream.completion is None
            with pytest.raises(StreamConsumedError) as err:
                async for _ in stream:
                    pass
            return str(err.value)

    said = asyncio.run(main())
    # (the loop left is closed by the event loop a moment later: read again at once, it may not be yet)
    assert "call stream() again" in said and ".completion" not in said


def test_an_async_stream_read_twice_says_what_to_do() -> None:
    async def main() -> str:
        async with AsyncHybridLLM(edge=_edge(), cache=False) as llm:
            stream = llm.stream("hi")
            assert "".join([c.text async for c in stream]) == "one two three four five"
            with pytest.raises(StreamConsumedError) as err:
                aiter(stream)
            return str(err.value)

    said = asyncio.run(main())
    assert "already read" in said and "Call stream() again" in said and ".completion" in said
