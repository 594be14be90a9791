"""Closing the device worker tells the requests that wait at once (review 20), with fake models.

``close()`` cancelled the waiting jobs but left them in the queue for the worker thread, which
reaches them only after the running job's current step (a long prompt's prefill): their readers
waited that long for "the device model is closed", and when the step outlived ``close()``'s
timeout, up to ``edge_wait_timeout_s`` for a busy error that said to retry a device that was gone.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from hybridllm import EdgeBusyError, EdgeError
from hybridllm.backends.base import Delta
from hybridllm.backends.worker import EdgeWorker


def _answer():
    yield Delta("never", finish_reason="stop")


async def _read(deltas):
    return [d.text async for d in deltas]


def test_close_during_a_long_step_ends_the_waiting_requests_at_once():
    async def main():
        loop = asyncio.get_running_loop()
        worker = EdgeWorker(None, wait_timeout_s=30.0)  # type: ignore[arg-type]
        began, gate = threading.Event(), threading.Event()

        def long_prefill():
            began.set()
            gate.wait(10)  # one step that outlives close()'s timeout
            yield Delta("late", finish_reason="stop")

        running = asyncio.ensure_future(_read(worker.stream(long_prefill)))
        assert await loop.run_in_executor(None, began.wait, 5)
        waiting = asyncio.ensure_future(_read(worker.stream(_answer)))
        run = worker.inline(_answer, feed=lambda d: d.text, finish=lambda: "done")
        inline = loop.run_in_executor(None, lambda: list(run.chunks()))
        await asyncio.sleep(0.05)
        try:
            assert not await loop.run_in_executor(None, worker.close, 0.1)  # the step runs on
            # both waiting readers hear that the device is closed now, not after the step
            with pytest.raises(EdgeError, match="device model is closed") as info:
                await asyncio.wait_for(waiting, 2)
            assert not isinstance(info.value, EdgeBusyError)
            assert await asyncio.wait_for(inline, 2) == []
            assert isinstance(run._error, EdgeError) and not isinstance(run._error, EdgeBusyError)
            assert "device model is closed" in str(run._error)
        finally:
            gate.set()
        await asyncio.wait_for(running, 5)
        assert worker.close(5)

    asyncio.run(main())
