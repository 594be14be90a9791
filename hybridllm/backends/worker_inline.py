"""The sync client's device answer, generated on the thread that reads it (:class:`InlineRun`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from .._exceptions import EdgeBusyError, EdgeError
from .base import Delta
from .cancel import watch
from .worker_job import CLOSED_MID_ANSWER, DEVICE_CLOSED


class InlineRun:
    """A device answer for the sync client, generated on the thread that reads it.

    It waits in the worker's queue like any job; when its turn comes the worker only marks it
    started, and the reader runs the backend's token loop itself (deltas -> ``feed`` -> chunks),
    so no token crosses a thread. A reader must not hold the device while it idles: when another
    request arrives, the worker takes the token loop over (between two tokens; ``_gen_lock``) and
    generates the rest into a buffer that the reader drains, as on the async path. The pipeline
    yields this object in place of its edge chunks; after :meth:`chunks`, :meth:`deliver` (on the
    pipeline's loop) hands the final chunk, or the error, back through :attr:`outcome`.
    """

    completion = None  # not a chunk: passes the pipeline's "is this the last chunk" checks

    def __init__(
        self,
        make: Callable[[], Iterator[Delta]],
        feed: Callable[[Delta], Any],
        finish: Callable[[], Any],
        *,
        wait_timeout_s: float | None,
        retry_after: Callable[[], float | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        turn_coming: Callable[[InlineRun], bool] = lambda run: False,
    ) -> None:
        self._make, self._feed, self._finish = make, feed, finish
        self._turn_coming = turn_coming  # its turn is a thread switch away (EdgeWorker._turn_coming)
        self._wait_timeout_s = wait_timeout_s
        self._retry_after = retry_after  # a retry's wait (the worker's queue), for a busy error
        self.ahead = 0
        self._clock = clock
        # the time spent in the token loop's steps (reader's and worker's): what the device took.
        # Not the time the turn was held: a reader printing slowly holds it (nobody waiting) and
        # made the worker's time per answer, so a busy error's retry_after_s, far too large
        self.device_s = 0.0
        self.answered = False  # a delta was generated (see EdgeJob.answered)
        self.outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.cancelled = threading.Event()
        self.started = threading.Event()
        self.done = threading.Event()
        self.entered = False  # chunks() has begun: from then on it frees the turn itself
        self._cond = threading.Condition()  # the state below
        self._gen_lock = threading.Lock()  # held around each step of the token loop
        self._it: Iterator[Delta] | None = None
        self._owner = "reader"  # "worker" once the worker took the token loop over
        self._reader_done = False
        self._released = False
        self._contended = False
        self._buffer: deque[object] = deque()
        self._worker_done = False
        self._result: Any = None
        self._error: BaseException | None = None

    @property
    def released(self) -> bool:
        """The turn is over: the reader ended it, or the worker finished the rest."""
        return self._released

    # -- called by the worker (and close) ------------------------------------------------------
    def cancel(self) -> None:
        with self._cond:
            self.cancelled.set()
            # a reader still waiting for its turn wakes, finds the run cancelled and ends: the
            # turn may never come (a cancelled job leaves the queue without running)
            self.started.set()
            self._cond.notify_all()

    def contend(self) -> None:
        """Another request waits for the device."""
        with self._cond:
            self._contended = True
            self._cond.notify_all()

    def abandon(self) -> None:
        """The reader will not run (it gave up waiting, or never came): never hold the worker."""
        with self._cond:
            self.cancelled.set()
            self.started.set()  # as in cancel: nobody waits for a turn that may never come
            self._released = True
            self._cond.notify_all()

    def run(self, contended: bool = False) -> None:
        """On the worker thread: grant the turn, wait for its end, take over if others wait."""
        with self._cond:
            if self.cancelled.is_set():
                self.started.set()  # a waiting reader wakes and finds the device closed
                self.done.set()
                return
            self._contended = self._contended or contended
            self.started.set()
            # others waiting, or close(): take the token loop over from a reader that may be idle
            while not self._released and not self._contended and not self.cancelled.is_set():
                self._cond.wait()
        if not self._released:
            with self._gen_lock:
                take = not self._reader_done and not self._released
                if take:
                    self._owner = "worker"
            if take:
                self._generate_rest()
        with self._cond:
            while not self._released and self._owner == "reader":
                self._cond.wait()
        self.done.set()

    def _generate_rest(self) -> None:
        it = self._it
        previous = watch(self.cancelled)  # the token loop stops at its next token once cancelled
        try:
            while not self.cancelled.is_set():
                t = self._clock()
                try:
                    if it is None:
                        it = self._it = self._make()
                    delta = next(it, None)
                finally:
                    self.device_s += self._clock() - t
                if delta is None:
                    break
                self.answered = True
                with self._cond:
                    self._buffer.append(delta)
                    self._cond.notify_all()
        except BaseException as exc:  # the reader raises it (as in EdgeJob.run: the worker lives on)
            with self._cond:
                self._buffer.append(exc)
        finally:
            try:
                if it is not None:
                    getattr(it, "close", lambda: None)()
            except BaseException as exc:  # noqa: BLE001
                with self._cond:
                    self._buffer.append(exc)
            watch(previous)
            with self._cond:
                self._worker_done = self._released = True
                self._cond.notify_all()

    # -- called by the reader ------------------------------------------------------------------
    def _next_delta(self) -> Delta | None:
        """The next delta: from the token loop itself, or from the buffer after a takeover."""
        with self._gen_lock:
            if self._owner == "reader":
                t = self._clock()
                # set for this step only: between steps this thread may step another answer
                previous = watch(self.cancelled)
                try:
                    if self._it is None:
                        self._it = self._make()
                    delta = next(self._it, None)
                finally:
                    watch(previous)
                    self.device_s += self._clock() - t
                if delta is None:
                    self._reader_done = True
                else:
                    self.answered = True
                return delta
        with self._cond:
            while not self._buffer and not self._worker_done:
                self._cond.wait()
            item = self._buffer.popleft() if self._buffer else None
        if isinstance(item, BaseException):
            raise item
        return item  # type: ignore[return-value]

    def chunks(self) -> Iterator[Any]:
        """On the reader's thread: wait for the model's turn, then generate and yield chunks.
        Leaving early (closing this iterator) stops generation at once and frees the turn."""
        self.entered = True
        timeout = self._wait_timeout_s
        if timeout is not None and timeout >= threading.TIMEOUT_MAX:
            timeout = None  # Event.wait refuses more (OverflowError): inf (allowed) is forever
        try:
            if not self._wait_turn(timeout):
                self.cancel()  # out of the queue first: the estimate counts the jobs ahead of a retry
                raise EdgeBusyError(
                    f"The device model was busy for {self._wait_timeout_s:g} s ({self.ahead} "
                    "request(s) were ahead of this one); retry later or raise edge_wait_timeout_s.",
                    retry_after_s=self._retry_after(),
                )
            if self.cancelled.is_set():
                raise EdgeError(DEVICE_CLOSED)
            finished = False
            while (delta := self._next_delta()) is not None:
                finished = delta.finish_reason is not None
                chunk = self._feed(delta)
                if chunk is not None:
                    yield chunk
                if self.cancelled.is_set():
                    break
            if self.cancelled.is_set() and not finished:  # close() stopped it half way
                raise EdgeError(CLOSED_MID_ANSWER)
            self._result = self._finish()
        except Exception as exc:  # handed to the pipeline, raised there (as on the worker path)
            self._error = exc
        finally:
            self._end_turn()

    def _wait_turn(self, timeout: float | None) -> bool:
        """Wait for the turn; False when ``timeout`` passed with the device busy. Next in line on an
        idle device, the turn is the worker thread's switch away: waited for past the timeout."""
        while not self.started.wait(timeout):
            if not self._turn_coming(self):
                return self.started.is_set()
        return True

    def _end_turn(self) -> None:
        try:
            with self._gen_lock:
                mine = self._owner == "reader"
                self._reader_done = True
                it, self._it = (self._it, None) if mine else (None, self._it)
            if it is not None:
                getattr(it, "close", lambda: None)()  # stops decoding at once
        except Exception as exc:  # noqa: BLE001
            self._error = self._error or exc
        finally:
            # even when a Ctrl-C (or a close() raising one) cuts the above short: a turn never
            # freed left the worker waiting for this reader forever, and every later request busy
            with self._cond:
                self.cancelled.set()  # a worker still generating for us stops at its next token
                self._released = True
                self._cond.notify_all()

    def deliver(self) -> None:
        """On the pipeline's loop: the outcome of :meth:`chunks` to the waiting pipeline."""
        if self.outcome.done():
            return
        if self._error is not None:
            self.outcome.set_exception(self._error)
        elif self._result is None:
            self.outcome.set_exception(EdgeError("The device answer was not generated."))
        else:
            self.outcome.set_result(self._result)
