"""close() while threads read: a reader waiting for the device model's turn is woken by a close.

Under load, `test_close_while_threads_read_stops_them_cleanly[chat]` left a reader waiting
after close(). The reader's answer was queued behind another on the device; close() (the
client's, or the stream's) cancelled it there, and the next request to queue dropped the
cancelled job from the queue, unrun: its reader, waiting for a turn that never came, waited
out edge_wait_timeout_s (300 s by default). Here each step is held so the race is certain."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Iterator

from hybridllm import HybridLLM, HybridLLMError
from hybridllm._types import GenerationParams, Messages
from hybridllm.backends.base import Delta
from hybridllm.backends.fake import FakeBackend

WAIT_S = 20.0  # edge_wait_timeout_s: the old code's reader waited this long


class _GatedBackend(FakeBackend):
    """The answer to "hold" stops after its first token until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def stream(self, messages: Messages, params: GenerationParams) -> Iterator[Delta]:
        for i, delta in enumerate(super().stream(messages, params)):
            if i == 1 and "hold" in str(messages[-1]["content"]):
                assert self.gate.wait(30)
            yield delta


def _until(cond, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _where(t: threading.Thread) -> str:
    frame = sys._current_frames().get(t.ident or -1)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(ended)"


def _read(llm: HybridLLM, prompt: str, out: dict[str, object], streams: dict) -> threading.Thread:
    def run() -> None:
        try:
            with llm.stream(prompt) as s:
                streams[prompt] = s
                out[prompt] = "".join(ch.text for ch in s)
        except HybridLLMError as exc:
            out[prompt] = exc

    t = threading.Thread(target=run, name=f"reader {prompt!r}", daemon=True)
    t.start()
    return t


def _holding_then_waiting(llm: HybridLLM, backend: _GatedBackend, out: dict, streams: dict):
    """"hold" has the device (stopped mid-answer); "wait" is queued behind it, its reader
    waiting for its turn."""
    holder = _read(llm, "hold", out, streams)
    _until(lambda: len(backend.calls) == 1, "the first answer to start")
    waiter = _read(llm, "wait", out, streams)
    _until(lambda: "wait" in streams and streams["wait"]._inline is not None
           and streams["wait"]._inline.entered, "the second reader to wait for its turn")
    return holder, waiter


def test_a_stream_closed_while_waiting_for_its_turn_ends_its_reader():
    backend = _GatedBackend()
    llm = HybridLLM(edge=backend, cache=False, edge_wait_timeout_s=WAIT_S)
    out: dict[str, object] = {}
    streams: dict = {}
    try:
        holder, waiter = _holding_then_waiting(llm, backend, out, streams)
        streams["wait"].close()  # from this thread: its queued job is cancelled
        third = _read(llm, "next", out, streams)  # the next request queues behind
        _until(lambda: "next" in streams and streams["next"]._inline is not None,
               "the third request to queue")
        backend.gate.set()
        waiter.join(timeout=5)
        assert not waiter.is_alive(), "the closed stream's reader still waits:\n" + _where(waiter)
        holder.join(timeout=10)
        third.join(timeout=10)
        assert not holder.is_alive() and not third.is_alive()
        assert out["hold"] == "echo: hold" and out["next"] == "echo: next"
        assert isinstance(out["wait"], HybridLLMError) and "closed" in str(out["wait"])
        assert [c[-1]["content"] for c in backend.calls] == ["hold", "next"]  # "wait" never ran
    finally:
        backend.gate.set()
        llm.close()


def test_close_while_a_reader_waits_and_another_request_starts_ends_every_reader():
    """The client's close() cancels the waiting answer, and a request that starts while close()
    runs (a reader's next question) queues after it: each reader still ends (the two that were
    there with HybridLLMError)."""
    backend = _GatedBackend()
    llm = HybridLLM(edge=backend, cache=False, edge_wait_timeout_s=WAIT_S)
    out: dict[str, object] = {}
    streams: dict = {}
    try:
        holder, waiter = _holding_then_waiting(llm, backend, out, streams)
        late: list[threading.Thread] = []
        stop = type(streams["wait"])._stop_for_client
        hold_run = streams["hold"]._inline
        cancel_hold = hold_run.cancel

        def stop_wait_then_ask() -> None:  # close() stops "wait" first, then a request queues
            if late:
                return
            stop(streams["wait"])
            late.append(_read(llm, "late", out, streams))
            _until(lambda: "late" in streams and streams["late"]._inline is not None,
                   "the late request to queue")

        def stop_hold() -> None:
            stop_wait_then_ask()
            stop(streams["hold"])

        def cancel_then_release() -> None:  # "hold" goes on only once it is cancelled
            cancel_hold()
            backend.gate.set()

        streams["wait"]._stop_for_client = stop_wait_then_ask
        streams["hold"]._stop_for_client = stop_hold
        hold_run.cancel = cancel_then_release
        closer = threading.Thread(target=llm.close, name="close", daemon=True)
        closer.start()
        _until(lambda: late, "the late request")
        for t in (waiter, holder, *late, closer):
            t.join(timeout=10)
            assert not t.is_alive(), f"{t.name} still runs after close():\n" + _where(t)
        for prompt in ("hold", "wait"):
            assert isinstance(out[prompt], HybridLLMError) and "closed" in str(out[prompt]), out
        # "late" started while close() ran: under load the device may give it its turn (and its
        # whole answer) before close() reaches the device; either way its reader ended
        late_out = out["late"]
        assert late_out == "echo: late" or (
            isinstance(late_out, HybridLLMError) and "closed" in str(late_out)), out
    finally:
        backend.gate.set()
        llm.close()


class _PausedLoop:
    """The client's loop thread, but the reader thread named ``who`` stops just after its step
    handed it the device answer's run, before it takes it (as a thread preempted there)."""

    def __init__(self, loop, who: str) -> None:
        self._inner, self._who = loop, who
        self.got, self.go = threading.Event(), threading.Event()

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def submit(self, coro):
        fut = self._inner.submit(coro)
        if threading.current_thread().name != self._who:
            return fut
        result = fut.result

        def paused_result(timeout=None):
            value = result(timeout)
            if type(value).__name__ == "InlineRun":
                self.got.set()
                assert self.go.wait(30)
            return value

        fut.result = paused_result
        return fut


def test_a_stream_closed_just_before_its_reader_takes_the_run_ends_its_reader():
    """close() between the step that hands the reader its run and the reader taking it: close()
    saw no run to wake (the pipeline gave the turn up), and the next request dropped the job."""
    backend = _GatedBackend()
    llm = HybridLLM(edge=backend, cache=False, edge_wait_timeout_s=WAIT_S)
    out: dict[str, object] = {}
    streams: dict = {}
    try:
        holder = _read(llm, "hold", out, streams)
        _until(lambda: len(backend.calls) == 1, "the first answer to start")
        paused = llm._loop = _PausedLoop(llm._loop, "reader 'wait'")
        waiter = _read(llm, "wait", out, streams)
        assert paused.got.wait(10)
        streams["wait"].close()
        third = _read(llm, "next", out, streams)
        _until(lambda: "next" in streams and streams["next"]._inline is not None,
               "the third request to queue")
        paused.go.set()
        waiter.join(timeout=5)
        assert not waiter.is_alive(), "the closed stream's reader still waits:\n" + _where(waiter)
        backend.gate.set()
        holder.join(timeout=10)
        third.join(timeout=10)
        assert not holder.is_alive() and not third.is_alive()
        assert out["hold"] == "echo: hold" and out["next"] == "echo: next"
        assert isinstance(out["wait"], HybridLLMError) and "closed" in str(out["wait"])
        assert [c[-1]["content"] for c in backend.calls] == ["hold", "next"]
    finally:
        backend.gate.set()
        llm.close()
