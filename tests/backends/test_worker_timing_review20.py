"""The device worker's time per answer counts the device's time, not a slow reader's (review 20).

The worker's moving average of the time per job gives a busy error's ``retry_after_s``. The sync
client's inline run (the reader's own thread runs the token loop while it holds the device) was
timed from the grant of its turn to its end: a sync stream read slowly (a UI printing slowly, a
paused generator) while nobody waited counted its pauses as device time, and the next busy error
said to wait minutes behind answers of a second. Now an inline run counts the time spent in its
token loop's steps (the reader's and, after a takeover, the worker's). The async path generates
into the job's buffer, so a slow reader never held the device there. A job that generated nothing
(the backend refused it at once) took ~0 s and pulled the average down by a quarter each time;
it is no longer a sample. Fake clock, fake models.
"""

from __future__ import annotations

import asyncio

import pytest

from hybridllm.backends.base import Delta
from hybridllm.backends.worker import EdgeWorker


def _timed_worker():
    now = [100.0]
    worker = EdgeWorker(None, max_waiting=8, wait_timeout_s=5.0)  # type: ignore[arg-type]
    worker._clock = lambda: now[0]
    return worker, now


def _three_steps(now):
    """An answer of three tokens, each step taking 1 s of the fake clock."""
    def make():
        for i, text in enumerate(["a", "b", "c"]):
            now[0] += 1.0
            yield Delta(text, finish_reason="stop" if i == 2 else None)
    return make


async def _settled(worker):
    """Until the worker has timed its job (it does so just after the job ends)."""
    for _ in range(500):
        if worker._service_s is not None:
            return worker._service_s
        await asyncio.sleep(0.01)
    raise AssertionError("the job was never timed")


def test_a_sync_reader_printing_slowly_does_not_count_as_device_time():
    async def main():
        loop = asyncio.get_running_loop()
        worker, now = _timed_worker()

        def slow_print(delta):
            now[0] += 50.0  # the reader takes 50 s per token (nobody waits: it keeps the turn)
            return delta.text

        run = worker.inline(_three_steps(now), feed=slow_print, finish=lambda: "done")
        assert await loop.run_in_executor(None, lambda: list(run.chunks())) == ["a", "b", "c"]
        run.deliver()
        assert await run.outcome == "done"
        # 3 s of token steps (before: 153 s, the reader's printing included)
        assert await _settled(worker) == pytest.approx(3.0)
        assert worker.retry_after_s() == 0.0  # nothing ahead of a request now
        assert worker.close(5)

    asyncio.run(main())


def test_a_sync_readers_pause_before_the_worker_takes_over_is_not_device_time():
    async def main():
        loop = asyncio.get_running_loop()
        worker, now = _timed_worker()
        run = worker.inline(_three_steps(now), feed=lambda d: d.text, finish=lambda: "done")
        gen = run.chunks()
        assert await loop.run_in_executor(None, next, gen) == "a"
        now[0] += 100.0  # the reader pauses between two next() calls
        # another request: the worker takes the token loop over and generates the rest
        second = worker.stream(lambda: iter([Delta("second", finish_reason="stop")]))
        assert await loop.run_in_executor(None, list, gen) == ["b", "c"]
        run.deliver()
        assert await run.outcome == "done"
        assert [d.text async for d in second] == ["second"]
        for _ in range(500):  # until the second job (0 s of the fake clock) is timed too
            if worker._current is None and not worker._jobs:
                break
            await asyncio.sleep(0.01)
        # 3 s (1 by the reader, 2 by the worker), then 0 s weighing a quarter
        # (before: 103 s held, so 77 s per answer)
        assert worker._service_s == pytest.approx(0.75 * 3.0)
        assert worker.close(5)

    asyncio.run(main())


def test_a_slow_async_reader_does_not_hold_the_device():
    async def main():
        worker, now = _timed_worker()
        stream = worker.stream(_three_steps(now))
        first = await stream.__anext__()
        assert first.text == "a"
        # the job ran ahead into its buffer while this reader read one delta: the device is free
        assert await _settled(worker) == pytest.approx(3.0)
        now[0] += 100.0  # the reader pauses
        assert [d.text async for d in stream] == ["b", "c"]
        assert worker._service_s == pytest.approx(3.0)
        assert worker.close(5)

    asyncio.run(main())


@pytest.mark.parametrize("path", ["async", "inline"])
def test_requests_refused_by_the_backend_at_once_do_not_shrink_the_time_per_answer(path):
    async def main():
        loop = asyncio.get_running_loop()
        worker, now = _timed_worker()
        assert [d.text async for d in worker.stream(_three_steps(now))] == ["a", "b", "c"]
        assert await _settled(worker) == pytest.approx(3.0)

        def refused():
            raise ValueError("the prompt does not fit")  # the backend's error, before any token

        for _ in range(4):
            if path == "async":
                with pytest.raises(ValueError, match="does not fit"):
                    [d async for d in worker.stream(refused)]
            else:
                run = worker.inline(refused, feed=lambda d: d.text, finish=lambda: "done")
                assert await loop.run_in_executor(None, list, run.chunks()) == []
                assert isinstance(run._error, ValueError)
        for _ in range(500):  # until the worker is done with the last one
            if worker._current is None and not worker._jobs:
                break
            await asyncio.sleep(0.01)
        # still 3 s per answer (before: 4 answers of 0 s weighing a quarter each, 0.95 s)
        assert worker._service_s == pytest.approx(3.0)
        assert worker.close(5)

    asyncio.run(main())
