"""A cancelled job that leaves the device's queue tells its waiting reader (fake models).

A new request filters cancelled jobs out of the worker's queue. They were dropped without their
``run()``, which is what wakes a reader waiting for its turn: a sync reader whose queued answer was
cancelled (its stream closed from another thread) waited out ``edge_wait_timeout_s`` (300 s by
default) once another request queued (cfebc39 wakes it from the stream; this is the queue's side).
"""

from __future__ import annotations

import asyncio
import threading

from hybridllm.backends.base import Delta
from hybridllm.backends.worker import EdgeWorker


def _answer():
    yield Delta("never", finish_reason="stop")


async def _read(deltas):
    return [d.text async for d in deltas]


def test_a_cancelled_waiting_reader_wakes_when_another_request_queues():
    async def main():
        loop = asyncio.get_running_loop()
        worker = EdgeWorker(None, wait_timeout_s=20.0)  # type: ignore[arg-type]
        began, gate = threading.Event(), threading.Event()

        def busy():
            began.set()
            gate.wait(10)  # holds the device while the other requests queue
            yield Delta("done", finish_reason="stop")

        running = asyncio.ensure_future(_read(worker.stream(busy)))
        assert await loop.run_in_executor(None, began.wait, 5)
        run = worker.inline(_answer, feed=lambda d: d.text, finish=lambda: "done")
        reader = loop.run_in_executor(None, lambda: list(run.chunks()))
        await asyncio.sleep(0.05)  # the reader waits for its turn
        run.cancel()  # its stream closed from another thread
        late = worker.stream(_answer)  # the next request queues: the cancelled job leaves the queue
        try:
            # before: the reader waited out the 20 s timeout for a turn that never came
            assert await asyncio.wait_for(reader, 3) == []
        finally:
            gate.set()
        assert await asyncio.wait_for(running, 5) == ["done"]
        assert await asyncio.wait_for(_read(late), 5) == ["never"]
        assert worker.close(5)

    asyncio.run(main())
