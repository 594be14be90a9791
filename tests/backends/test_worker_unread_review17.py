"""The device worker's streams that are never read, and its exit with several stuck workers
(review 17), with fake models.

- ``EdgeWorker.stream()`` queues the job at once, but the job was cancelled only by its async
  generator's ``finally``, which never runs for a generator never started: a stream closed or
  dropped before its first read had its whole answer generated for nobody, the device busy.
- At interpreter exit the workers were closed one after another, each waiting up to
  ``EXIT_WAIT_S``: two stuck workers made the exit wait twice as long (the second was not even
  cancelled while the first was waited for).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref

import pytest

from hybridllm import EdgeError
from hybridllm.backends import worker as worker_mod
from hybridllm.backends.base import Delta
from hybridllm.backends.worker import EdgeWorker


def _answer():
    yield Delta("hello ")
    yield Delta("world", finish_reason="stop")


async def _read(deltas):
    return [d.text async for d in deltas]


async def _wait(event: threading.Event) -> bool:
    return await asyncio.get_running_loop().run_in_executor(None, event.wait, 5)


@pytest.mark.parametrize("how", ["aclose", "dropped"])
def test_a_stream_closed_or_dropped_before_its_first_read_generates_nothing(how):
    async def main():
        worker = EdgeWorker(None)  # type: ignore[arg-type]
        began, gate = threading.Event(), threading.Event()

        def holds_the_device():
            yield Delta("a")
            began.set()
            gate.wait(10)
            yield Delta("b", finish_reason="stop")

        first = asyncio.ensure_future(_read(worker.stream(holds_the_device)))
        assert await _wait(began)
        made = []

        def unread():
            made.append("generated")
            yield Delta("for nobody", finish_reason="stop")

        stream = worker.stream(unread)
        try:
            assert worker.num_waiting == 1
            if how == "aclose":
                await stream.aclose()
            else:
                del stream
                gc.collect()
            assert worker.num_waiting == 0  # no longer waits for the device
        finally:
            gate.set()
        assert await asyncio.wait_for(first, 5) == ["a", "b"]
        # the next request runs after the unread one's turn: it was passed over, not generated
        assert await asyncio.wait_for(_read(worker.stream(_answer)), 5) == ["hello ", "world"]
        assert made == []
        assert worker.close(5)

    asyncio.run(main())


def test_a_stream_read_to_its_end_then_dropped_is_unaffected():
    async def main():
        worker = EdgeWorker(None)  # type: ignore[arg-type]
        stream = worker.stream(_answer)
        assert await asyncio.wait_for(_read(stream), 5) == ["hello ", "world"]
        del stream
        gc.collect()
        assert await asyncio.wait_for(_read(worker.stream(_answer)), 5) == ["hello ", "world"]
        assert worker.close(5)

    asyncio.run(main())


def test_the_exit_waits_once_for_all_stuck_workers_not_once_each(monkeypatch):
    wait_s = 1.0
    monkeypatch.setattr(worker_mod, "EXIT_WAIT_S", wait_s)

    async def main():
        gate = threading.Event()
        workers = [EdgeWorker(None) for _ in range(2)]  # type: ignore[arg-type]
        # only these workers are closed by the exit handler, not other tests' ones
        live = weakref.WeakSet(workers)
        monkeypatch.setattr(worker_mod, "_LIVE", live)
        began = [threading.Event() for _ in workers]
        readers = []
        for worker, event in zip(workers, began, strict=True):

            def stuck(event=event):  # its current step ignores a cancel until the gate opens
                yield Delta("a")
                event.set()
                gate.wait(10)
                yield Delta("b")
                yield Delta("c", finish_reason="stop")

            readers.append(asyncio.ensure_future(_read(worker.stream(stuck))))
        for event in began:
            assert await _wait(event)
        try:
            t0 = time.monotonic()
            worker_mod._close_at_exit()
            elapsed = time.monotonic() - t0
        finally:
            gate.set()
        assert elapsed >= wait_s * 0.9  # it did wait for the stuck generations
        assert elapsed < wait_s * 1.7, f"the exit waited {elapsed:.2f} s, one wait per worker"
        for reader in readers:  # both were cancelled: their readers learn the answer is cut off
            with pytest.raises(EdgeError, match="incomplete"):
                await asyncio.wait_for(reader, 5)
        for worker in workers:
            assert worker.close(5)

    asyncio.run(main())
