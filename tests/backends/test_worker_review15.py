"""The device worker outlives a backend that raises a BaseException (review 15).

A custom edge backend's SystemExit (or a CancelledError of its own event loop) ended the worker
thread: the reader took the stream's end for a finished answer (cut short, silently), and every
later request waited ``edge_wait_timeout_s`` for a device that was gone, then was told it was busy.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from hybridllm import AsyncHybridLLM, EdgeError
from hybridllm._types import Usage
from hybridllm.backends.base import Backend, Delta
from hybridllm.backends.worker import EdgeWorker

HI = [{"role": "user", "content": "hi"}]


def _dies_once():
    calls = []

    def make():
        calls.append(1)
        yield Delta("hello ")
        if len(calls) == 1:
            raise SystemExit(3)
        yield Delta("world", finish_reason="stop", usage=Usage(1, 2))

    return make


async def _read(deltas):
    return [d.text async for d in deltas]


def test_a_backends_system_exit_is_an_edge_error_and_the_worker_lives_on():
    async def main():
        worker = EdgeWorker(None, wait_timeout_s=2.0)  # type: ignore[arg-type]
        make = _dies_once()
        with pytest.raises(EdgeError, match="SystemExit: 3; the answer is incomplete") as err:
            await _read(worker.stream(make))
        assert isinstance(err.value.__cause__, SystemExit)
        assert await asyncio.wait_for(_read(worker.stream(make)), 5) == ["hello ", "world"]
        assert worker.close(5)

    asyncio.run(main())


class _Dies(Backend):
    name = "dies"

    def __init__(self):
        self._make = _dies_once()

    def stream(self, messages, params):
        return self._make()


def test_the_async_client_is_not_handed_half_an_answer_and_answers_the_next_request():
    async def main():
        client = AsyncHybridLLM(edge=_Dies(), cache=False, edge_wait_timeout_s=2.0)
        try:
            with pytest.raises(EdgeError, match="incomplete"):
                await client.chat(HI)
            start = time.monotonic()
            assert (await client.chat(HI)).text == "hello world"
            assert time.monotonic() - start < 1.5  # not the wait for a worker that was gone
        finally:
            await client.aclose()

    asyncio.run(main())


def test_a_system_exit_after_the_worker_took_over_an_inline_answer_reaches_its_reader():
    async def main():
        loop = asyncio.get_running_loop()
        worker = EdgeWorker(None, wait_timeout_s=2.0)  # type: ignore[arg-type]
        make = _dies_once()
        run = worker.inline(make, lambda d: d.text or None, lambda: "finished")
        chunks = run.chunks()
        assert await loop.run_in_executor(None, next, chunks) == "hello "
        second = worker.stream(make)  # another request: the worker takes the token loop over
        for _ in range(500):
            if run._worker_done:
                break
            await asyncio.sleep(0.01)
        assert run._owner == "worker"

        def rest():
            try:
                return list(chunks)
            except SystemExit as exc:  # as when the reader ran the backend itself
                return exc
        assert isinstance(await loop.run_in_executor(None, rest), SystemExit)
        assert run._result is None  # never a finished answer
        assert await asyncio.wait_for(_read(second), 5) == ["hello ", "world"]
        assert worker.close(5)

    asyncio.run(main())
