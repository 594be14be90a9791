"""The device worker's queue bound (review 19): ``edge_max_waiting`` counts the requests that wait.

A burst of 1 + edge_max_waiting requests on an idle device: the first was still in the queue when
the others came (the worker thread had not taken it yet), so it was counted as waiting and the
last request was refused with EdgeBusyError although only edge_max_waiting of them ever waited.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from hybridllm import EdgeBusyError
from hybridllm._types import Usage
from hybridllm.backends.base import Delta
from hybridllm.backends.worker import EdgeWorker


def _answer(text):
    def make():
        yield Delta(text, finish_reason="stop", usage=Usage(1, 1))
    return make


async def _read(deltas):
    return [d.text async for d in deltas]


def _held_worker(monkeypatch, **kwargs):
    """A worker whose thread takes its first job only once ``go`` is set (a busy machine)."""
    go = threading.Event()
    run = EdgeWorker._run

    def late_run(self):
        go.wait(10)
        run(self)

    monkeypatch.setattr(EdgeWorker, "_run", late_run)
    return EdgeWorker(None, **kwargs), go  # type: ignore[arg-type]


@pytest.mark.parametrize("max_waiting", [1, 3])
def test_a_burst_on_an_idle_device_of_one_plus_max_waiting_is_served_in_order(monkeypatch, max_waiting):
    async def main():
        worker, go = _held_worker(monkeypatch, max_waiting=max_waiting, wait_timeout_s=5.0)
        # one runs, max_waiting wait: all are taken
        streams = [worker.stream(_answer(str(i))) for i in range(1 + max_waiting)]
        with pytest.raises(EdgeBusyError, match=f"^{max_waiting} requests already wait"):
            worker.stream(_answer("one too many"))
        go.set()
        got = [await asyncio.wait_for(_read(s), 5) for s in streams]
        assert got == [[str(i)] for i in range(1 + max_waiting)]  # first come, first served
        assert worker.close(5)

    asyncio.run(main())


def test_behind_a_running_answer_max_waiting_still_bounds_the_queue():
    async def main():
        loop = asyncio.get_running_loop()
        worker = EdgeWorker(None, max_waiting=1, wait_timeout_s=5.0)  # type: ignore[arg-type]
        began, gate = threading.Event(), threading.Event()

        def long_answer():
            began.set()
            gate.wait(5)
            yield Delta("long", finish_reason="stop")

        first = worker.stream(long_answer)
        reading = asyncio.ensure_future(_read(first))
        assert await loop.run_in_executor(None, began.wait, 5)
        second = worker.stream(_answer("second"))  # the one that waits
        with pytest.raises(EdgeBusyError, match="^1 requests already wait"):
            worker.stream(_answer("third"))
        gate.set()
        assert await asyncio.wait_for(reading, 5) == ["long"]
        assert await asyncio.wait_for(_read(second), 5) == ["second"]
        assert worker.close(5)

    asyncio.run(main())
