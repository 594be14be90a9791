"""A busy device says how long to wait (review 20): ``EdgeBusyError.retry_after_s`` (fakes, fast).

Before: ``EdgeBusyError`` had no ``retry_after_s`` (``CloudError`` has one), so a library caller that
caught it could not know how long to wait; only ``hybridllm serve`` estimated a Retry-After. Now the
worker times the jobs it runs and every busy error it raises carries (the jobs ahead of a retry:
waiting + the running one) x the recent time per job, or None before a job was timed.
"""

from __future__ import annotations

import asyncio
import pickle
import threading

import pytest

from hybridllm import EdgeBusyError
from hybridllm._types import Usage
from hybridllm.backends.base import Delta
from hybridllm.backends.worker import EdgeWorker


def _answer(text, now=None, took_s=0.0):
    """A job that answers ``text``, advancing the fake clock ``now`` by ``took_s``."""
    def make():
        if now is not None:
            now[0] += took_s
        yield Delta(text, finish_reason="stop", usage=Usage(1, 1))
    return make


async def _read(deltas):
    return [d.text async for d in deltas]


def _timed_worker(**kwargs):
    now = [100.0]
    worker = EdgeWorker(None, **kwargs)  # type: ignore[arg-type]
    worker._clock = lambda: now[0]
    return worker, now


async def _hold(worker):
    """A running job that holds the device until the returned event is set."""
    began, gate = threading.Event(), threading.Event()

    def long_answer():
        began.set()
        gate.wait(5)
        yield Delta("long", finish_reason="stop")

    reading = asyncio.ensure_future(_read(worker.stream(long_answer)))
    assert await asyncio.get_running_loop().run_in_executor(None, began.wait, 5)
    return gate, reading


def test_the_error_carries_retry_after_s_and_pickles_with_it():
    err = EdgeBusyError("busy; retry later", retry_after_s=2.5)
    assert err.retry_after_s == 2.5 and str(err) == "busy; retry later"
    assert EdgeBusyError("busy").retry_after_s is None
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is EdgeBusyError and back.retry_after_s == 2.5 and back.args == err.args


def test_a_full_queue_says_how_long_the_queue_ahead_takes():
    async def main():
        worker, now = _timed_worker(max_waiting=1, wait_timeout_s=5.0)
        # nothing timed yet: unknown
        gate, reading = await _hold(worker)
        second = worker.stream(_answer("second"))
        with pytest.raises(EdgeBusyError) as info:
            worker.stream(_answer("refused"))
        assert info.value.retry_after_s is None
        gate.set()
        assert await asyncio.wait_for(reading, 5) == ["long"]
        assert await asyncio.wait_for(_read(second), 5) == ["second"]

        worker._service_s = None  # (the two above took ~0 s of the fake clock)
        assert await asyncio.wait_for(_read(worker.stream(_answer("a", now, 2.0))), 5) == ["a"]
        gate, reading = await _hold(worker)
        second = worker.stream(_answer("second"))
        with pytest.raises(EdgeBusyError, match="already wait") as info:
            worker.stream(_answer("refused"))
        # one running + one waiting, 2 s per answer
        assert info.value.retry_after_s == pytest.approx(4.0)
        gate.set()
        await asyncio.wait_for(reading, 5)
        await asyncio.wait_for(_read(second), 5)
        assert worker.close(5)

    asyncio.run(main())


def test_a_wait_past_the_timeout_says_how_long_a_retry_waits():
    async def main():
        worker, now = _timed_worker(max_waiting=8, wait_timeout_s=0.2)
        assert await asyncio.wait_for(_read(worker.stream(_answer("a", now, 3.0))), 5) == ["a"]
        gate, reading = await _hold(worker)
        with pytest.raises(EdgeBusyError, match="busy for 0.2 s") as info:
            await _read(worker.stream(_answer("late")))
        # only the running one is ahead of a retry (the timed-out request left the queue)
        assert info.value.retry_after_s == pytest.approx(3.0)
        gate.set()
        await asyncio.wait_for(reading, 5)
        assert worker.close(5)

    asyncio.run(main())


def test_the_sync_readers_turn_past_the_timeout_says_how_long_a_retry_waits():
    async def main():
        loop = asyncio.get_running_loop()
        worker, now = _timed_worker(max_waiting=8, wait_timeout_s=0.2)
        assert await asyncio.wait_for(_read(worker.stream(_answer("a", now, 3.0))), 5) == ["a"]
        gate, reading = await _hold(worker)
        run = worker.inline(_answer("late"), feed=lambda d: d.text, finish=lambda: "done")
        assert await loop.run_in_executor(None, lambda: list(run.chunks())) == []
        assert isinstance(run._error, EdgeBusyError), run._error
        assert run._error.retry_after_s == pytest.approx(3.0)
        gate.set()
        await asyncio.wait_for(reading, 5)
        assert worker.close(5)

    asyncio.run(main())
