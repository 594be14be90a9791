"""The device worker's queue at its edges (review 17), with fake models and no sleeps that race.

- ``edge_wait_timeout_s=inf`` (the settings allow it: "positive or None") failed every sync stream
  with ``OverflowError: timestamp out of range``: ``Event.wait`` refuses a timeout that long.
- A Ctrl-C while a sync reader's answer was being closed (the model's ``close()`` raising it)
  never freed the device's turn: the worker waited for that reader forever, every later request
  was told the device was busy.
- The busy message counted only the waiting requests: behind one long answer it said
  "busy for 300 s (0 request(s) were ahead of this one)".
- A job whose reader's loop closed before its turn still had its prompt prefilled and a token
  decoded, for nobody.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from hybridllm import EdgeBusyError, EdgeError, HybridLLM
from hybridllm._types import Usage
from hybridllm.backends.base import Backend, Delta
from hybridllm.backends.worker import EdgeWorker

HI = [{"role": "user", "content": "hi"}]


def _answer():
    yield Delta("hello ")
    yield Delta("world", finish_reason="stop", usage=Usage(1, 2))


async def _read(deltas):
    return [d.text async for d in deltas]


class _Fake(Backend):
    name = "fake"

    def stream(self, messages, params):
        return _answer()


class _SaysWhenWaited(threading.Event):
    def __init__(self):
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout=None):
        self.waiting.set()
        return super().wait(timeout)


@pytest.mark.parametrize("timeout", [float("inf"), 1e12, threading.TIMEOUT_MAX])
def test_a_wait_timeout_past_what_a_thread_can_wait_is_forever_not_an_overflow(timeout):
    async def main():
        loop = asyncio.get_running_loop()
        worker = EdgeWorker(None, wait_timeout_s=timeout)  # type: ignore[arg-type]
        began, gate = threading.Event(), threading.Event()

        def long_answer():
            yield Delta("a")
            began.set()
            gate.wait(10)
            yield Delta("b", finish_reason="stop")

        first = asyncio.ensure_future(_read(worker.stream(long_answer)))
        assert await loop.run_in_executor(None, began.wait, 5)
        run = worker.inline(_answer, lambda d: d.text, lambda: "finished")
        run.started = _SaysWhenWaited()  # (the worker cannot reach it yet: the device is busy)
        chunks = loop.run_in_executor(None, lambda: list(run.chunks()))
        assert await loop.run_in_executor(None, run.started.waiting.wait, 5)  # it waits its turn
        gate.set()
        assert await asyncio.wait_for(chunks, 5) == ["hello ", "world"]
        run.deliver()
        assert await run.outcome == "finished"
        assert await asyncio.wait_for(first, 5) == ["a", "b"]
        assert worker.close(5)

    asyncio.run(main())


def test_the_sync_client_streams_with_an_infinite_wait_timeout():
    with HybridLLM(edge=_Fake(), cache=False, edge_wait_timeout_s=float("inf")) as client:
        assert "".join(c.text for c in client.stream(HI)) == "hello world"


class _CtrlCOnClose:
    """A model's token loop whose close() is hit by a Ctrl-C."""

    def __init__(self):
        self._it = _answer()

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def close(self):
        raise KeyboardInterrupt


def test_a_ctrl_c_while_a_sync_answer_is_closed_frees_the_device_for_the_next_request():
    async def main():
        loop = asyncio.get_running_loop()
        worker = EdgeWorker(None, wait_timeout_s=2.0)  # type: ignore[arg-type]
        run = worker.inline(_CtrlCOnClose, lambda d: d.text, lambda: "finished")
        chunks = run.chunks()

        def read_one_then_leave():
            first = next(chunks)
            try:
                chunks.close()
            except KeyboardInterrupt:  # the reader's Ctrl-C reaches it
                return first, "interrupted"
            return first, "closed"

        assert await loop.run_in_executor(None, read_one_then_leave) == ("hello ", "interrupted")
        # the next request is served, not told (after 2 s) that the device is busy
        assert await asyncio.wait_for(_read(worker.stream(_answer)), 5) == ["hello ", "world"]
        assert worker.close(5)

    asyncio.run(main())


def test_the_busy_message_counts_the_answer_that_holds_the_device():
    async def main():
        worker = EdgeWorker(None, wait_timeout_s=0.2)  # type: ignore[arg-type]
        began, gate = threading.Event(), threading.Event()

        def long_answer():
            yield Delta("a")
            began.set()
            gate.wait(10)
            yield Delta("b", finish_reason="stop")

        first = asyncio.ensure_future(_read(worker.stream(long_answer)))
        assert await asyncio.get_running_loop().run_in_executor(None, began.wait, 5)
        with pytest.raises(EdgeBusyError, match=r"\(1 request\(s\) were ahead of this one\)"):
            await _read(worker.stream(_answer))
        second = worker.stream(_answer)  # the cancelled one above no longer counts
        with pytest.raises(EdgeBusyError, match=r"\(1 request\(s\) were ahead of this one\)"):
            await _read(second)
        gate.set()
        assert await asyncio.wait_for(first, 5) == ["a", "b"]
        assert worker.close(5)

    asyncio.run(main())


def test_a_job_whose_loop_closed_before_its_turn_is_not_generated():
    worker = EdgeWorker(None, wait_timeout_s=5.0)  # type: ignore[arg-type]
    began, gate = threading.Event(), threading.Event()
    orphan_calls = []

    def long_answer():
        yield Delta("a")
        began.set()
        gate.wait(10)
        yield Delta("b", finish_reason="stop")

    def orphan():
        orphan_calls.append(1)
        return _answer()

    async def read(make):
        return await _read(worker.stream(make))

    async def queue_and_leave():
        worker.stream(orphan)  # queued; this loop is closed before its turn comes

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(asyncio.run, read(long_answer))
        assert began.wait(5)
        asyncio.run(queue_and_leave())
        gate.set()
        assert first.result(5) == ["a", "b"]
    # queued after the orphan: served after it, by a worker that is still alive
    assert asyncio.run(asyncio.wait_for(read(_answer), 5)) == ["hello ", "world"]
    assert orphan_calls == []  # no prefill for a reader that is gone
    assert worker.close(5)
    assert not any(t.name == "hybridllm-edge" and t.is_alive() and t is worker._thread
                   for t in threading.enumerate())


def test_close_gives_every_caller_a_clear_error_and_leaves_no_thread():
    async def main():
        loop = asyncio.get_running_loop()
        worker = EdgeWorker(None, wait_timeout_s=5.0)  # type: ignore[arg-type]
        began = threading.Event()
        release = threading.Event()

        def endless():
            yield Delta("a")
            began.set()
            while True:
                release.wait(0.01)  # one "token"
                yield Delta("x")

        running = asyncio.ensure_future(_read(worker.stream(endless)))
        assert await loop.run_in_executor(None, began.wait, 5)
        waiting = asyncio.ensure_future(_read(worker.stream(_answer)))
        run = worker.inline(_answer, lambda d: d.text, lambda: "finished")
        inline = loop.run_in_executor(None, lambda: list(run.chunks()))
        await asyncio.sleep(0)  # (both queued; the order of close and their waits does not matter)
        assert await loop.run_in_executor(None, worker.close, 5)
        with pytest.raises(EdgeError, match="incomplete"):
            await asyncio.wait_for(running, 5)
        with pytest.raises(EdgeError, match="closed"):
            await asyncio.wait_for(waiting, 5)
        assert await asyncio.wait_for(inline, 5) == []
        assert isinstance(run._error, EdgeError) and "closed" in str(run._error)
        assert worker._thread is not None and worker._thread not in threading.enumerate()
        with pytest.raises(EdgeError, match="closed"):
            worker.stream(_answer)

    asyncio.run(main())


def test_a_ctrl_c_in_the_sync_readers_token_loop_leaves_the_device_serving():
    class CtrlC(Backend):
        name = "ctrlc"
        calls = 0

        def stream(self, messages, params):
            CtrlC.calls += 1
            yield Delta("hello ")
            if CtrlC.calls == 1:
                raise KeyboardInterrupt
            yield Delta("world", finish_reason="stop", usage=Usage(1, 2))

    with HybridLLM(edge=CtrlC(), cache=False, edge_wait_timeout_s=2.0) as client:
        with pytest.raises(KeyboardInterrupt):
            for _ in client.stream(HI):
                pass
        assert "".join(c.text for c in client.stream(HI)) == "hello world"
        assert client.chat(HI).text == "hello world"
