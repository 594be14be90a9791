"""One async device generation: a job run on the worker thread, its deltas read on an asyncio loop."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from .._exceptions import EdgeBusyError, EdgeError
from .base import Delta
from .cancel import watch

_STARTED = object()
_END = object()
# what a reader gets when close() (or the interpreter's exit) stopped its answer half way: an
# error, never a shorter answer passed off as finished
DEVICE_CLOSED = "The device model is closed."
CLOSED_MID_ANSWER = "The client was closed while the device model was answering; the answer is incomplete."


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
        self.answered = False  # a delta was generated: the worker's time per answer counts the job

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
        # the backend's token loop stops at its next token once cancelled, even a token without text
        previous = watch(self.cancelled)
        try:
            if self.cancelled.is_set():  # closed (or the reader's loop closed) just now: no
                self._post(EdgeError(DEVICE_CLOSED))  # prefill and token decoded for nobody
                return
            it = self._make()
            for delta in it:
                self._post(delta)
                self.answered = True
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
            watch(previous)
            self._post(_END)
            self.done.set()

    async def deltas(self, wait_timeout_s: float | None, ahead: int,
                     retry_after: Callable[[], float | None] = lambda: None,
                     turn_coming: Callable[[], bool] = lambda: False) -> AsyncIterator[Delta]:
        """The job's deltas, in order. Leaving early cancels the job and waits for it to stop.
        ``retry_after`` estimates a retry's wait (the worker's queue), for a busy error;
        ``turn_coming`` says the job is next on an idle device (EdgeWorker._turn_coming): its turn
        is the worker thread's switch away, waited for past ``wait_timeout_s``."""
        try:
            while True:
                try:
                    item = await asyncio.wait_for(self._items.get(), wait_timeout_s)
                    break
                except TimeoutError:
                    if turn_coming():
                        continue
                    self.cancel()  # out of the queue first: the estimate counts the jobs ahead of a retry
                    raise EdgeBusyError(
                        f"The device model was busy for {wait_timeout_s:g} s ({ahead} request(s) were "
                        "ahead of this one); retry later or raise edge_wait_timeout_s.",
                        retry_after_s=retry_after(),
                    ) from None
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
