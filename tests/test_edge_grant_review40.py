"""A request first in line on an idle device is never "busy" (review 40).

``edge_wait_timeout_s`` bounds the wait for the device's turn. On an idle device the turn is the
worker thread's to grant, a thread switch away; on a loaded machine (an app's threads holding the
GIL, two shared cores) that switch took longer than a short timeout, and the request failed with
``EdgeBusyError``: "The device model was busy for 0.05 s (0 request(s) were ahead of this one)", one
request in six with four busy threads and edge_wait_timeout_s=0.05. Now a timeout is a busy error
only when the device runs another request, or others wait ahead; next in line, a request waits for
the grant. Likewise a sync answer whose reader ended its turn no longer counts as running while the
worker thread has yet to wake and mark it done (with edge_max_waiting=1 the request after the next
one was refused meanwhile). (fakes, fast)
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hybridllm import AsyncHybridLLM, EdgeBusyError, HybridLLM
from hybridllm.backends.fake import FakeBackend
from hybridllm.backends.worker import EdgeWorker

GRANT_DELAY_S = 0.4  # the worker thread scheduled this late (edge_wait_timeout_s is 0.05)


@pytest.fixture
def slow_grant(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker thread takes GRANT_DELAY_S to run once started, as on a loaded machine."""
    run = EdgeWorker._run

    def late(self: EdgeWorker) -> None:
        time.sleep(GRANT_DELAY_S)
        run(self)

    monkeypatch.setattr(EdgeWorker, "_run", late)


def test_a_sync_request_on_an_idle_device_waits_for_its_grant(slow_grant: None) -> None:
    with HybridLLM(edge=FakeBackend(), cache=False, edge_wait_timeout_s=0.05) as llm:
        assert llm.chat("hi").text == "echo: hi"
        assert "".join(c.text for c in llm.stream("again")) == "echo: again"


def test_an_async_request_on_an_idle_device_waits_for_its_grant(slow_grant: None) -> None:
    async def main() -> str:
        async with AsyncHybridLLM(edge=FakeBackend(), cache=False, edge_wait_timeout_s=0.05) as llm:
            return (await llm.chat("hi")).text

    assert asyncio.run(main()) == "echo: hi"


def test_a_request_behind_a_running_one_is_still_busy_after_the_timeout() -> None:
    # the timeout still holds where the device is busy: a long answer runs, the next one gives up
    edge = FakeBackend(reply=lambda m: " ".join(["w"] * 200), delay_s=0.01)
    with HybridLLM(edge=edge, cache=False, edge_wait_timeout_s=0.1) as llm:
        first = llm.stream("long")
        next(first)  # the first answer holds the device
        failed: list[BaseException] = []

        def second() -> None:
            try:
                llm.chat("short")
            except EdgeBusyError as exc:
                failed.append(exc)

        other = threading.Thread(target=second)
        other.start()
        other.join(10)
        first.close()
        assert failed and "1 request(s) were ahead" in str(failed[0])


def _turn(worker: EdgeWorker):
    from hybridllm.backends.base import Delta

    return worker.inline(lambda: iter([Delta("x", finish_reason="stop")]), lambda d: d, lambda: "done")


def test_a_sync_answer_that_ended_its_turn_holds_no_place_in_the_queue() -> None:
    # a sync reader ends its turn, and the worker thread marks it done only once it wakes: in
    # between, the answer counted as running, so with edge_max_waiting=1 the request after the
    # next one was refused ("1 requests already wait"), though one was about to run and none waited
    async def main() -> None:
        worker = EdgeWorker(FakeBackend(), max_waiting=1, wait_timeout_s=5)
        first = _turn(worker)
        assert first.started.wait(5)  # the worker granted it, and waits for the reader to end it
        try:
            with first._cond:  # the worker thread cannot wake to mark it done while this is held
                assert [c.text for c in first.chunks()] == ["x"]  # the reader ends its turn
                assert not first.done.is_set()
                nxt = _turn(worker)  # about to run
                waiting = _turn(worker)  # the one waiting: edge_max_waiting=1 admits it
                assert worker._turn_coming(nxt)
            for run in (nxt, waiting):
                assert [c.text for c in run.chunks()] == ["x"]
        finally:
            worker.close()

    asyncio.run(main())
