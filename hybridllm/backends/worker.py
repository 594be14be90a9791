"""The device model on a dedicated thread: one generation at a time, in order of arrival.

A device model (one llama.cpp context, one ONNX session) can run one generation at a time. Instead
of a lock held while a caller reads its stream (which blocks every other caller for as long as
that one reads, and deadlocks a thread that opens a second stream), each request becomes a job on
one worker thread. The worker generates a job's answer into the job's own buffer and moves on, so
a slow or idle reader never holds the model; closing a stream cancels its job at the next token.

Waiting is bounded: at most ``max_waiting`` jobs may wait (more raises :class:`EdgeBusyError` at
once), and a job whose turn has not come within ``wait_timeout_s`` raises :class:`EdgeBusyError`.
Results go to an asyncio loop (the client's pipeline is async; the sync client drives it on its
own loop thread). The sync client's fast path skips that hop: an :class:`InlineRun` takes the
model's turn in the same queue, and the reading thread generates the answer itself, so no token
crosses a thread (two thread hops per token cost SmolLM2/Qwen 5-11% of their decode speed).

At interpreter exit every worker is closed (``atexit``): a generation still running is cancelled
and waited for (one token, at most ``EXIT_WAIT_S`` for all workers together). Without it the
model's native code went on decoding on a daemon thread while the process tore down the
libraries under it: an application that quit mid-answer died with a segmentation fault
(llama.cpp, about one exit in ten).
"""

from __future__ import annotations

import asyncio
import atexit
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from .._exceptions import EdgeBusyError, EdgeError
from .base import Backend, Delta
from .worker_inline import InlineRun
from .worker_job import DEVICE_CLOSED, EdgeJob, _JobStream

EXIT_WAIT_S = 10.0  # at exit, how long a running generation may take to stop (its current step)
_LIVE: weakref.WeakSet[EdgeWorker] = weakref.WeakSet()  # workers whose thread was started


@atexit.register
def _close_at_exit() -> None:
    """Stop every device generation before the interpreter tears down (see the module's doc)."""
    workers = list(_LIVE)
    # cancel them all first, then wait: closed one after another, each stuck worker added its
    # own EXIT_WAIT_S to the exit (the waits now share one deadline)
    for worker in workers:
        worker.cancel_all()
    deadline = time.monotonic() + EXIT_WAIT_S
    for worker in workers:
        worker.close(timeout_s=max(0.0, deadline - time.monotonic()))


class EdgeWorker:
    """Runs ``backend``'s generations on one thread, first come first served."""

    def __init__(
        self, backend: Backend, *, max_waiting: int = 64, wait_timeout_s: float | None = 300.0
    ) -> None:
        self.backend = backend
        self.max_waiting = max_waiting
        self.wait_timeout_s = wait_timeout_s
        self._jobs: deque[EdgeJob | InlineRun] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._current: EdgeJob | InlineRun | None = None
        self._closed = False
        self._clock: Callable[[], float] = time.monotonic
        self._service_s: float | None = None  # the recent time a job held the device (average)

    def on_worker_thread(self) -> bool:
        """Whether the caller runs on this worker's own thread (there, ``close`` cannot wait)."""
        return self._thread is not None and threading.current_thread() is self._thread

    @property
    def num_waiting(self) -> int:
        with self._cond:
            return sum(not j.cancelled.is_set() for j in self._jobs)

    def retry_after_s(self) -> float | None:
        """About how long a request queued now waits for its turn: the jobs ahead (waiting, and
        the one running) times the recent time per job; None before a job was timed."""
        with self._cond:
            if self._service_s is None:
                return None
            ahead = sum(not j.cancelled.is_set() for j in self._jobs)
            ahead += self._current is not None and not _over(self._current)
            return ahead * self._service_s

    def _submit(self, make: Callable[[], Iterator[Delta]]) -> tuple[EdgeJob, int]:
        job = EdgeJob(make, asyncio.get_running_loop())
        return job, self._enqueue(job)

    def _enqueue(self, job: EdgeJob | InlineRun) -> int:
        with self._cond:
            if self._closed:
                raise EdgeError(DEVICE_CLOSED)
            # a cancelled job leaves the queue, but through its run(), which only tells a reader
            # still waiting for its turn (never blocks, as in cancel_all): dropped silently, that
            # reader waited out edge_wait_timeout_s for a turn that never came
            kept: deque[EdgeJob | InlineRun] = deque()
            for j in self._jobs:
                if j.cancelled.is_set():
                    j.run()
                else:
                    kept.append(j)
            self._jobs = kept
            ahead = len(self._jobs)
            # (a sync answer whose reader ended its turn runs no more, though the worker thread,
            # not awake yet, has not marked it done: counted running, the request after the next
            # one was refused with edge_max_waiting=1, and a busy error counted it ahead)
            running = self._current is not None and not _over(self._current)
            # with the device free, the first queued job is about to run, not waiting: counted as
            # waiting, a burst of 1 + edge_max_waiting requests on an idle device had one refused
            # before the worker thread took the first
            waiting = ahead - (not running and ahead > 0)
            if waiting >= self.max_waiting:
                raise EdgeBusyError(
                    f"{waiting} requests already wait for the device model (edge_max_waiting="
                    f"{self.max_waiting}); retry later.", retry_after_s=self.retry_after_s()
                )
            self._jobs.append(job)
            # the requests ahead of this one, for the busy message: the waiting ones and the one
            # running (before, "busy for 300 s (0 request(s) were ahead...)" behind a long answer)
            ahead += running
            if isinstance(self._current, InlineRun):
                self._current.contend()  # an idle sync reader must not hold the device
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hybridllm-edge", daemon=True)
                self._thread.start()
                _LIVE.add(self)
            self._cond.notify()
        return ahead

    def stream(self, make: Callable[[], Iterator[Delta]]) -> AsyncIterator[Delta]:
        """Queue ``make`` (called on the worker thread) and return its deltas as they come."""
        job, ahead = self._submit(make)
        deltas = job.deltas(self.wait_timeout_s, ahead, self.retry_after_s, lambda: self._turn_coming(job))
        return _JobStream(job, deltas)

    def inline(
        self, make: Callable[[], Iterator[Delta]], feed: Callable[[Delta], Any], finish: Callable[[], Any]
    ) -> InlineRun:
        """Queue a turn for ``make`` to run on the reader's thread (see :class:`InlineRun`);
        called on the pipeline's loop. Raises :class:`EdgeBusyError` when too many wait."""
        job = InlineRun(make, feed, finish, wait_timeout_s=self.wait_timeout_s,
                        retry_after=self.retry_after_s, clock=self._clock, turn_coming=self._turn_coming)
        job.ahead = self._enqueue(job)
        return job

    def _turn_coming(self, job: EdgeJob | InlineRun) -> bool:
        """Whether ``job``'s turn is about to come: no other request holds the device or waits
        ahead of it, and the worker thread lives, so only that thread's switch to it is left. A
        wait past ``wait_timeout_s`` is a busy error only otherwise: on a loaded machine (threads
        holding the GIL) that switch outlasted a short timeout, and a request on an idle device
        failed as "busy (0 request(s) were ahead of this one)"."""
        with self._cond:
            if self._closed or self._thread is None or not self._thread.is_alive():
                return False
            current = self._current
            if current is not None and current is not job and not _over(current):
                return False
            for queued in self._jobs:
                if queued is job:
                    return True
                if not queued.cancelled.is_set():
                    return False
            return current is job

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._current = self._jobs.popleft()
                others = bool(self._jobs)
            start = self._clock()
            if isinstance(job, InlineRun):
                job.run(contended=others)
                took = job.device_s  # its token loop's steps, not a slow reader's pauses
            else:
                job.run()  # generates into the job's buffer: a slow reader does not hold it
                took = self._clock() - start
            with self._cond:
                self._current = None
                # a moving average: the newest job weighs a quarter (as the proxy's DeviceClock).
                # Only a job that generated: one cancelled while it waited, or refused by the
                # backend at once (a prompt it cannot take), took ~0 s, and a few of them in a row
                # made the next busy error's retry_after_s a fraction of a real answer's time
                if job.answered:
                    s = self._service_s
                    self._service_s = took if s is None else 0.75 * s + 0.25 * took

    def cancel_all(self) -> threading.Thread | None:
        """Close to new jobs and cancel every job, the running one at its next token; no wait.
        Returns the worker's thread (None when it never started)."""
        with self._cond:
            self._closed = True
            if self._current is not None:
                self._current.cancel()
            # the waiting ones end here, their readers told at once that the device is closed:
            # left for the worker, they waited out the running job's step (a long prompt's
            # prefill), or edge_wait_timeout_s and a "busy" error when close() timed out on it
            waiting, self._jobs = self._jobs, deque()
            for job in waiting:
                job.cancel()
                job.run()  # cancelled: only says so to its reader, never blocks
            self._cond.notify_all()
            return self._thread

    def close(self, timeout_s: float = 30.0) -> bool:
        """Cancel every job, the running one at its next token, and wait for the thread to end,
        so the model can be freed safely afterwards. False when the thread is still running after
        ``timeout_s`` (one token took longer): the model must not be freed under it."""
        thread = self.cancel_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            return not thread.is_alive()
        return True


def _over(job: EdgeJob | InlineRun) -> bool:
    """Whether ``job`` no longer holds the device, though the worker may not have marked it done
    yet (a sync reader that ended its turn has freed it)."""
    return job.done.is_set() or (isinstance(job, InlineRun) and job.released)
