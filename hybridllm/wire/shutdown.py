"""Graceful shutdown, as both servers do it: close admission, let requests in flight finish, then
end the rest cleanly.

    SIGTERM / Ctrl-C -> Drain.run: is_closing; /health and new /v1 requests answer 503
                        (server_shutting_down); the listener stays open meanwhile, so callers and load
                        balancers get that answer rather than a refused connection
                     -> wait up to the grace period (--shutdown-timeout) for the /v1 requests in flight
                     -> expired: the rest end now, their engine requests aborted: a stream with an
                        in-band error event and [DONE], a non-streamed request with 503 (one still
                        sending its body too, ``until_expired``); one log line
                     -> uvicorn closes the connections, the lifespan stops the engine (or the proxy
                        closes its HybridLLM); exit status 0

A second Ctrl-C cuts the wait short (the engine is still stopped cleanly; a third forces the exit).
uvicorn alone closes the listener at once, then cancels whatever still runs after its timeout: cut-off
streams, a plain-text 500 and a traceback in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import uvicorn
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import WireError
from .sse import wait_for_disconnect

logger = logging.getLogger("hybridllm.wire")
T = TypeVar("T")

SHUTTING_DOWN = "The server is shutting down; retry the request on another server."


def shutting_down() -> Exception:
    """The refusal of a request that comes (or is still running) too late: 503."""
    return WireError(SHUTTING_DOWN, status=503, type="server_error", code="server_shutting_down")


class ClientGone(Exception):
    """The client disconnected before its response was ready; its work was cancelled."""


class Drain:
    """Shutdown state the routes share: ``is_closing`` refuses new work, ``expired`` ends the rest.
    ``error`` makes the exception a refused or ended request raises (a server's own 503 type)."""

    def __init__(self, error: Callable[[], Exception] = shutting_down) -> None:
        self.is_closing = False
        self.is_expired = False
        # one Event per event loop: an asyncio.Event is bound to the first loop that waits on it,
        # and waiting from another (an app served by a TestClient without ``with``: a loop per
        # request) raised RuntimeError, which the watchers took for the shutdown: a bogus 503
        self._expired: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Event] = (
            weakref.WeakKeyDictionary())
        self.num_active = 0
        self.error = error

    @property
    def expired(self) -> asyncio.Event:
        """Set once the grace period has ended; for the running event loop."""
        loop = asyncio.get_running_loop()
        event = self._expired.get(loop)
        if event is None:
            event = self._expired[loop] = asyncio.Event()
            if self.is_expired:
                event.set()
        return event

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        self.num_active += 1
        try:
            yield
        finally:
            self.num_active -= 1

    def check_open(self) -> None:
        if self.is_closing:
            raise self.error()

    async def run(self, grace_s: float, *, skip_wait: Callable[[], bool] = lambda: False,
                  settle_s: float = 5.0) -> int:
        """Close admission, wait up to ``grace_s`` for the requests in flight, then end the rest and
        give them up to ``settle_s`` to send their last bytes; returns how many were ended."""
        self.is_closing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        if self.num_active and grace_s > 0:
            logger.info("shutting down: new requests refused, waiting up to %gs for %d in flight",
                        grace_s, self.num_active)
        while self.num_active and not skip_wait() and loop.time() < deadline:
            await asyncio.sleep(0.05)
        num_ended = self.num_active
        if num_ended:
            when = "the grace period cut short" if skip_wait() else f"the {grace_s:g}s grace period"
            logger.warning("shutting down: ending %d request(s) still running after %s", num_ended, when)
        self.is_expired = True
        self.expired.set()
        for other, event in list(self._expired.items()):  # requests served on another loop
            if other is not loop and not other.is_closed():
                other.call_soon_threadsafe(event.set)
        deadline = loop.time() + settle_s
        while self.num_active and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return num_ended


async def unless_interrupted(request: Request, work: Awaitable[T], drain: Drain) -> T:
    """Run ``work``; cancel it (which aborts its request) if first the client disconnects (then
    ClientGone) or the shutdown's grace period ends (then ``drain.error()``)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(request.receive))
    stopper = asyncio.ensure_future(drain.expired.wait())
    try:
        await asyncio.wait({task, watcher, stopper}, return_when=asyncio.FIRST_COMPLETED)
        is_gone = watcher.done()
    finally:
        watcher.cancel()
        stopper.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled() or not task.done():
        if not is_gone:
            # the 503 now; the cancelled work ends in the background: it may wait for a device step
            # that cannot be stopped (a long prefill, seconds), and past the server's own shutdown
            # timeout the request was cut without its answer
            in_background(task)
            raise drain.error()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientGone
    return task.result()


_BACKGROUND: set[asyncio.Future] = set()  # strong references: the loop keeps only weak ones


def in_background(work: Awaitable[object]) -> None:
    """Let ``work`` (the close of an answer cut by the shutdown) finish on its own; its outcome is
    read, so an error in it is no "exception was never retrieved" line."""
    task = asyncio.ensure_future(work)
    _BACKGROUND.add(task)

    def done(t: asyncio.Future) -> None:
        _BACKGROUND.discard(t)
        if not t.cancelled() and t.exception() is not None:
            logger.warning("closing an answer ended by the shutdown failed: %s", type(t.exception()).__name__)

    task.add_done_callback(done)


async def until_expired(work: Awaitable[T], drain: Drain) -> T:
    """Run ``work`` (reading a request's body: it owns ``receive``, so no disconnect watcher here);
    cancel it and raise ``drain.error()`` if the shutdown's grace period ends first. A body still
    coming in then held the shutdown until uvicorn cancelled it: a plain-text 500 and a traceback."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(drain.expired.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled() or not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise drain.error()
    return task.result()


class TrackRequests:
    """ASGI middleware: counts the /v1 requests in flight, from the first byte to the last."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        with self.drain.track():
            await self.app(scope, receive, send)


class GracefulServer(uvicorn.Server):
    """uvicorn's server, draining ``drain`` for ``grace_s`` seconds before its own shutdown."""

    def __init__(self, config: uvicorn.Config, drain: Drain, grace_s: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.grace_s = grace_s

    async def shutdown(self, sockets: list | None = None) -> None:
        await self.drain.run(self.grace_s, skip_wait=lambda: self.force_exit)
        # Every request has ended: uvicorn's shutdown is short now, so let it run whole after a
        # second Ctrl-C too (forced, it skips stopping the engine and logs a traceback for that).
        self.force_exit = False
        await super().shutdown(sockets=sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn's own re-raises the signal after the shutdown, so the process would die by it
        # (status -15, or 130 for Ctrl-C): a shutdown that was asked for and done is a success.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
