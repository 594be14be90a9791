"""The device model on a dedicated thread: one generation at a time, in order of arrival.

A device model (one llama.cpp context, one ONNX session) can run one generation at a time. Instead
of a lock held while a caller reads its stream (which blocks every other caller for as long as
that one reads, and deadlocks a thread that opens a second stream), each request becomes a job on
one worker thread. The worker generates a job's answer into the job's own buffer and moves on, so
a slow or idle reader never holds the model; closing a stream cancels its job at the next token.

Waiting is bounded: at most ``max_waiting`` jobs may wait (more raises :class:`EdgeBusyError` at
once), and a job whose turn has not come within ``wait_timeout_s`` raises :class:`EdgeBusyError`.
Results go to an asyncio loop (the client's pipeline is async; the sync client drives it on its
own loop thread).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator

from .._exceptions import EdgeBusyError, EdgeError
from .base import Backend, Delta

_STARTED = object()
_END = object()


class EdgeJob:
    """One generation: made and run on the worker thread, read on an asyncio loop."""

    def __init__(self, make: Callable[[], Iterator[Delta]], loop: asyncio.AbstractEventLoop) -> None:
        self._make = make
        self._loop = loop
        self._items: asyncio.Queue[object] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.started = threading.Event()
        self.done = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()

    def _post(self, item: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the reader's loop is closed: nobody is reading any more
            self.cancelled.set()

    def run(self) -> None:
        """On the worker thread: generate into the buffer until done or cancelled."""
        if self.cancelled.is_set():
            self.done.set()
            return
        self.started.set()
        self._post(_STARTED)
        it: Iterator[Delta] | None = None
        try:
            it = self._make()
            for delta in it:
                self._post(delta)
                if self.cancelled.is_set():
                    break
        except Exception as exc:  # handed to the reader, raised there
            self._post(exc)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                try:
                    close()  # stops decoding at once
                except Exception as exc:  # noqa: BLE001 - a failing close must not kill the worker
                    self._post(exc)
            self._post(_END)
            self.done.set()

    async def deltas(self, wait_timeout_s: float | None, ahead: int) -> AsyncIterator[Delta]:
        """The job's deltas, in order. Leaving early cancels the job and waits for it to stop."""
        try:
            try:
                first = await asyncio.wait_for(self._items.get(), wait_timeout_s)
            except TimeoutError:
                raise EdgeBusyError(
                    f"The device model was busy for {wait_timeout_s:g} s ({ahead} request(s) were "
                    "ahead of this one); retry later or raise edge_wait_timeout_s."
                ) from None
            item = first
            while True:
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, Delta):
                    yield item
                item = await self._items.get()
        finally:
            self.cancel()
            if self.started.is_set() and not self.done.is_set():
                # wait for the worker to stop decoding, so a closed stream costs nothing more
                await asyncio.get_running_loop().run_in_executor(None, self.done.wait, 30.0)


class EdgeWorker:
    """Runs ``backend``'s generations on one thread, first come first served."""

    def __init__(
        self, backend: Backend, *, max_waiting: int = 64, wait_timeout_s: float | None = 300.0
    ) -> None:
        self.backend = backend
        self.max_waiting = max_waiting
        self.wait_timeout_s = wait_timeout_s
        self._jobs: deque[EdgeJob] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._current: EdgeJob | None = None
        self._closed = False

    @property
    def num_waiting(self) -> int:
        with self._cond:
            return sum(not j.cancelled.is_set() for j in self._jobs)

    def _submit(self, make: Callable[[], Iterator[Delta]]) -> tuple[EdgeJob, int]:
        job = EdgeJob(make, asyncio.get_running_loop())
        with self._cond:
            if self._closed:
                raise EdgeError("The device model is closed.")
            self._jobs = deque(j for j in self._jobs if not j.cancelled.is_set())
            ahead = len(self._jobs)
            if ahead >= self.max_waiting:
                raise EdgeBusyError(
                    f"{ahead} requests already wait for the device model (edge_max_waiting="
                    f"{self.max_waiting}); retry later."
                )
            self._jobs.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hybridllm-edge", daemon=True)
                self._thread.start()
            self._cond.notify()
        return job, ahead

    def stream(self, make: Callable[[], Iterator[Delta]]) -> AsyncIterator[Delta]:
        """Queue ``make`` (called on the worker thread) and return its deltas as they come."""
        job, ahead = self._submit(make)
        return job.deltas(self.wait_timeout_s, ahead)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._current = self._jobs.popleft()
            job.run()
            with self._cond:
                self._current = None

    def close(self, timeout_s: float = 30.0) -> None:
        """Cancel every job, the running one at its next token, and wait for the thread to end,
        so the model can be freed safely afterwards."""
        with self._cond:
            self._closed = True
            for job in [*self._jobs, *([self._current] if self._current else [])]:
                job.cancel()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
