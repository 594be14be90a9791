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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from .._exceptions import EdgeBusyError, EdgeError
from .base import Backend, Delta

_STARTED = object()
_END = object()
# what a reader gets when close() (or the interpreter's exit) stopped its answer half way: an
# error, never a shorter answer passed off as finished
DEVICE_CLOSED = "The device model is closed."
CLOSED_MID_ANSWER = "The client was closed while the device model was answering; the answer is incomplete."
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


def _stopped(exc: BaseException) -> EdgeError:
    """A backend's BaseException that is no Exception (SystemExit...) as the reader's EdgeError."""
    err = EdgeError(f"The device backend stopped with {type(exc).__name__}"
                    f"{f': {exc}' if str(exc) else ''}; the answer is incomplete.")
    err.__cause__ = exc
    return err


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
        if self.cancelled.is_set():  # closed (or the reader left) while it waited its turn
            self._post(EdgeError(DEVICE_CLOSED))
            self._post(_END)
            self.done.set()
            return
        self.started.set()
        self._post(_STARTED)
        it: Iterator[Delta] | None = None
        finished = False
        try:
            if self.cancelled.is_set():  # closed (or the reader's loop closed) just now: no
                self._post(EdgeError(DEVICE_CLOSED))  # prefill and token decoded for nobody
                return
            it = self._make()
            for delta in it:
                self._post(delta)
                finished = delta.finish_reason is not None
                if self.cancelled.is_set():
                    break
            if self.cancelled.is_set() and not finished:  # a reader still there was cut off
                self._post(EdgeError(CLOSED_MID_ANSWER))
        except Exception as exc:  # handed to the reader, raised there
            self._post(exc)
        except BaseException as exc:
            # a backend's SystemExit (or a CancelledError of its own loop): let through, it ended
            # the worker thread, the reader took its _END for a finished answer (cut short) and
            # every later request waited edge_wait_timeout_s for a device that was gone. Raised
            # as it is on the reader's loop it would stop that loop: an EdgeError instead
            self._post(_stopped(exc))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                try:
                    close()  # stops decoding at once
                except BaseException as exc:  # noqa: BLE001 - a failing close must not kill the worker
                    self._post(exc if isinstance(exc, Exception) else _stopped(exc))
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


class _JobStream:
    """The async iterator :meth:`EdgeWorker.stream` returns: the job's deltas, and its cancel
    for a stream closed (``aclose``) or dropped before its first read. The job is queued at once,
    but an async generator runs no ``finally`` until it is started: such a stream's answer was
    generated in full for nobody, the device busy meanwhile."""

    def __init__(self, job: EdgeJob, deltas: AsyncIterator[Delta]) -> None:
        self._job = job
        self._deltas = deltas
        # on garbage collection (any thread): cancel only sets an Event; never at exit (the
        # atexit handler closes the workers itself)
        weakref.finalize(self, job.cancel).atexit = False

    def __aiter__(self) -> _JobStream:
        return self

    def __anext__(self) -> Awaitable[Delta]:
        return self._deltas.__anext__()

    async def aclose(self) -> None:
        self._job.cancel()  # a started generator's own finally cancels it too (and waits)
        await self._deltas.aclose()  # type: ignore[attr-defined]


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
    ) -> None:
        self._make, self._feed, self._finish = make, feed, finish
        self._wait_timeout_s = wait_timeout_s
        self.ahead = 0
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

    # -- called by the worker (and close) ------------------------------------------------------
    def cancel(self) -> None:
        with self._cond:
            self.cancelled.set()
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
        try:
            while not self.cancelled.is_set():
                if it is None:
                    it = self._it = self._make()
                delta = next(it, None)
                if delta is None:
                    break
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
            with self._cond:
                self._worker_done = self._released = True
                self._cond.notify_all()

    # -- called by the reader ------------------------------------------------------------------
    def _next_delta(self) -> Delta | None:
        """The next delta: from the token loop itself, or from the buffer after a takeover."""
        with self._gen_lock:
            if self._owner == "reader":
                if self._it is None:
                    self._it = self._make()
                delta = next(self._it, None)
                if delta is None:
                    self._reader_done = True
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
            if not self.started.wait(timeout):
                raise EdgeBusyError(
                    f"The device model was busy for {self._wait_timeout_s:g} s ({self.ahead} "
                    "request(s) were ahead of this one); retry later or raise edge_wait_timeout_s."
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

    def on_worker_thread(self) -> bool:
        """Whether the caller runs on this worker's own thread (there, ``close`` cannot wait)."""
        return self._thread is not None and threading.current_thread() is self._thread

    @property
    def num_waiting(self) -> int:
        with self._cond:
            return sum(not j.cancelled.is_set() for j in self._jobs)

    def _submit(self, make: Callable[[], Iterator[Delta]]) -> tuple[EdgeJob, int]:
        job = EdgeJob(make, asyncio.get_running_loop())
        return job, self._enqueue(job)

    def _enqueue(self, job: EdgeJob | InlineRun) -> int:
        with self._cond:
            if self._closed:
                raise EdgeError(DEVICE_CLOSED)
            self._jobs = deque(j for j in self._jobs if not j.cancelled.is_set())
            ahead = len(self._jobs)
            if ahead >= self.max_waiting:
                raise EdgeBusyError(
                    f"{ahead} requests already wait for the device model (edge_max_waiting="
                    f"{self.max_waiting}); retry later."
                )
            self._jobs.append(job)
            # the requests ahead of this one, for the busy message: the waiting ones and the one
            # running (before, "busy for 300 s (0 request(s) were ahead...)" behind a long answer)
            ahead += self._current is not None and not self._current.done.is_set()
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
        return _JobStream(job, job.deltas(self.wait_timeout_s, ahead))

    def inline(
        self, make: Callable[[], Iterator[Delta]], feed: Callable[[Delta], Any], finish: Callable[[], Any]
    ) -> InlineRun:
        """Queue a turn for ``make`` to run on the reader's thread (see :class:`InlineRun`);
        called on the pipeline's loop. Raises :class:`EdgeBusyError` when too many wait."""
        job = InlineRun(make, feed, finish, wait_timeout_s=self.wait_timeout_s)
        job.ahead = self._enqueue(job)
        return job

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._current = self._jobs.popleft()
                others = bool(self._jobs)
            if isinstance(job, InlineRun):
                job.run(contended=others)
            else:
                job.run()
            with self._cond:
                self._current = None

    def cancel_all(self) -> threading.Thread | None:
        """Close to new jobs and cancel every job, the running one at its next token; no wait.
        Returns the worker's thread (None when it never started)."""
        with self._cond:
            self._closed = True
            for job in [*self._jobs, *([self._current] if self._current else [])]:
                job.cancel()
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
