"""AsyncStream read with ``anext()`` and then ``async for`` from two tasks, as the sync Stream's
threads (helper-252's fix, tests/test_stream_dropped_review20.py): an ``async for`` over a stream
another task waits on in ``anext()`` is a StreamConsumedError, and that task's answer is left
whole. Before, ``__aiter__`` after ``anext()`` skipped the check: the loop met the other task's
read with "RuntimeError: anext(): asynchronous generator is already running", and its cleanup
closed the answer under the other task (fast: fakes, asyncio events)."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import AsyncIterator

import pytest

from hybridllm import AsyncHybridLLM, StreamConsumedError
from hybridllm._async_stream import AsyncStream
from hybridllm._types import Chunk, Completion, Usage
from hybridllm.backends.fake import FakeBackend

WORDS = ["a", "b", "c", "d", "e"]


class _Answer:
    """Five chunks (the last with its completion); the second waits for ``gate``."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()
        self.closed = False

    async def chunks(self) -> AsyncIterator[Chunk]:
        try:
            for i, word in enumerate(WORDS):
                if i == 1:
                    self.waiting.set()
                    await self.gate.wait()
                done = i == len(WORDS) - 1
                completion = Completion(text="".join(WORDS), route="edge", reason="test",
                                        model="m", usage=Usage(1, 5, 6)) if done else None
                yield Chunk(text=word, route="edge", model="m", completion=completion)
        finally:
            self.closed = True


async def _one_reader_waits(answer: _Answer) -> tuple[AsyncStream, list[str], asyncio.Task]:
    """A stream read with anext(), and a task waiting in anext() for its second chunk."""
    s = AsyncStream(answer.chunks())
    text = [(await anext(s)).text]

    async def read() -> str:
        try:
            while True:
                text.append((await anext(s)).text)
        except StopAsyncIteration:
            return "end"

    task = asyncio.create_task(read())
    await answer.waiting.wait()
    await asyncio.sleep(0)  # (the task is inside anext(), waiting for the chunk)
    return s, text, task


def test_async_for_while_another_task_waits_in_anext_is_refused_and_its_answer_left_whole():
    async def main() -> None:
        answer = _Answer()
        s, text, task = await _one_reader_waits(answer)
        with pytest.raises(StreamConsumedError, match="another thread or task"):
            async for _chunk in s:  # (RuntimeError "already running", and the answer closed)
                pass
        answer.gate.set()
        assert await asyncio.wait_for(task, 5) == "end"
        assert "".join(text) == "abcde" and s.completion is not None

    asyncio.run(main())


def test_a_loop_begun_before_another_task_waits_is_refused_at_its_read_and_closes_nothing():
    async def main() -> None:
        answer = _Answer()
        s = AsyncStream(answer.chunks())
        text = [(await anext(s)).text]
        it = aiter(s)  # nobody reads yet: the loop may begin

        async def read() -> str:
            try:
                while True:
                    text.append((await anext(s)).text)
            except StopAsyncIteration:
                return "end"

        task = asyncio.create_task(read())
        await answer.waiting.wait()
        await asyncio.sleep(0)
        with pytest.raises(StreamConsumedError, match="another thread or task"):
            await anext(it)
        assert not answer.closed  # the other task's answer goes on
        answer.gate.set()
        assert await asyncio.wait_for(task, 5) == "end"
        assert "".join(text) == "abcde" and s.completion is not None

    asyncio.run(main())


def test_async_for_after_anext_still_reads_on_and_leaving_it_stops_the_answer():
    async def main() -> None:
        answer = _Answer()
        answer.gate.set()
        s = AsyncStream(answer.chunks())
        text = (await anext(s)).text
        async for chunk in s:
            text += chunk.text
        assert text == "abcde" and s.completion is not None and answer.closed
        with pytest.raises(StopAsyncIteration):
            await anext(s)

        answer = _Answer()
        answer.gate.set()
        s = AsyncStream(answer.chunks())
        await anext(s)
        it = aiter(s)
        assert (await anext(it)).text == "b"
        await it.aclose()  # (what leaving an async for and dropping its iterator does)
        assert answer.closed and s.completion is None
        with pytest.raises(StreamConsumedError):
            await anext(s)

        answer = _Answer()
        answer.gate.set()
        s = AsyncStream(answer.chunks())
        await anext(s)
        async for _chunk in s:
            break
        for _ in range(3):  # (the loop closes the dropped loop's generator)
            await asyncio.sleep(0)
        assert answer.closed and s.completion is None

    asyncio.run(main())


def test_an_async_for_after_anext_does_not_end_as_complete_when_closed_half_way():
    async def main() -> None:
        answer = _Answer()
        answer.gate.set()
        s = AsyncStream(answer.chunks())
        await anext(s)
        it = aiter(s)
        await anext(it)
        await s.aclose()  # (from another task, between two chunks, it is the same)
        with pytest.raises(StreamConsumedError):
            await anext(it)
        assert s.completion is None

    asyncio.run(main())


class _Gated(FakeBackend):
    """Streams five words; the second waits for ``gate`` (a threading.Event: the backend runs
    on its own thread)."""

    def __init__(self) -> None:
        super().__init__(reply=lambda _m: " ".join(["w"] * 5))
        self.gate = threading.Event()
        self.waiting = threading.Event()

    def stream(self, messages, params):  # type: ignore[no-untyped-def]
        for i, delta in enumerate(super().stream(messages, params)):
            if i == 1:
                self.waiting.set()
                self.gate.wait(10)
            yield delta


@pytest.mark.parametrize("route", ["edge", "cloud"])
def test_the_client_async_stream_refuses_a_second_reader_and_leaves_the_first_whole(route):
    gated = _Gated()

    async def main() -> None:
        async with AsyncHybridLLM(edge=gated, cloud=gated, cache=False) as llm:
            s = llm.stream("go", route=route)
            text = [(await anext(s)).text]
            got: dict[str, object] = {}

            async def read() -> None:
                try:
                    while True:
                        text.append((await anext(s)).text)
                except StopAsyncIteration:
                    got["end"] = True
                except BaseException as exc:  # noqa: BLE001 - what the reader gets is the test
                    got["error"] = exc

            task = asyncio.create_task(read())
            while not gated.waiting.is_set() or s._step is None:
                await asyncio.sleep(0.001)
            try:
                with pytest.raises(StreamConsumedError, match="another thread or task"):
                    async for _chunk in s:
                        pass
            finally:
                gated.gate.set()
                await asyncio.wait_for(task, 10)
            assert got == {"end": True}
            assert "".join(text) == "w w w w w" and s.completion is not None

    asyncio.run(main())


def test_a_dropped_half_read_async_stream_is_not_kept_by_a_cycle():
    async def main() -> None:
        answer = _Answer()
        answer.gate.set()
        s = AsyncStream(answer.chunks())
        await anext(s)
        it = aiter(s)
        await anext(it)
        alive = weakref.ref(s)
        del s, it
        await asyncio.sleep(0)  # (the loop closes the dropped generators)
        await asyncio.sleep(0)
        assert alive() is None and answer.closed

    gc.disable()
    try:
        asyncio.run(main())
    finally:
        gc.enable()
