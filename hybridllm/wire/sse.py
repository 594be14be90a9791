"""Server-sent events that stop the producer when the client goes away.

Starlette's ``StreamingResponse`` only notices a vanished client when a write fails, which for
a request still waiting in the engine's (or the device's) queue may be much later. Here a watcher
task reads the ASGI ``receive`` channel; on ``http.disconnect`` it cancels the sending task, whose async
generator is then closed at once, so its ``finally`` aborts the engine request and frees its
KV blocks without waiting for the next token. A ``stop`` event (the end of the shutdown grace
period) cancels the sending task the same way, then ``last_events`` (made then, if a callable) end the
stream in-band.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ["EventStreamResponse", "client_gone", "on_client_disconnect", "wait_for_disconnect"]


def client_gone() -> Response:
    """The answer to a client that hung up before its response: nobody reads it, and it is no
    server error (no 500, no traceback): nginx's 499 "client closed request"."""
    return Response(status_code=499)


async def on_client_disconnect(request: object, exc: Exception) -> Response:
    """Exception handler for starlette's ``ClientDisconnect``: the client hung up mid-body (the
    catch-all handler would log a 500 and uvicorn a traceback)."""
    return client_gone()


async def wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class EventStreamResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], headers: dict[str, str] | None = None, *,
                 stop: asyncio.Event | None = None, last_events: str | Callable[[], str] = "") -> None:
        # Like StreamingResponse: no body, hence no Content-Length (chunked transfer instead).
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
        self.events = events
        self.stop = stop
        self.last_events = last_events
        self.is_started = False

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        self.is_started = True
        async for event in self.events:
            await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender = asyncio.ensure_future(self._send_all(send))
        watcher = asyncio.ensure_future(wait_for_disconnect(receive))
        stopper = asyncio.ensure_future(self.stop.wait() if self.stop is not None else asyncio.Future())
        stopped = False
        try:
            await asyncio.wait({sender, watcher, stopper}, return_when=asyncio.FIRST_COMPLETED)
            # stopped while the client still reads and the events still run: an in-band end
            stopped = stopper.done() and not sender.done() and not watcher.done()
        finally:
            for task in (sender, watcher, stopper):
                task.cancel()
            try:
                if stopped and self.is_started:
                    # The last events go out first: the sender ends only once the events are closed,
                    # which waits for the producer's current step (a device's long prefill, seconds),
                    # and the shutdown cut a stream still waiting then without its error event. A
                    # cancelled send() wrote nothing (uvicorn waits for the transport before it
                    # writes), so the last event is whole, and the sender sends nothing more.
                    with contextlib.suppress(OSError):
                        last = self.last_events() if callable(self.last_events) else self.last_events
                        await send({"type": "http.response.body", "body": last.encode(), "more_body": False})
                # A failed write (OSError from the server) also means the client is gone.
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await sender
            finally:
                # any other failure (a send that raised RuntimeError) still closes the events:
                # else the producer's engine request or device answer ran on with nobody to read it
                for task in (watcher, stopper):
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                aclose = getattr(self.events, "aclose", None)
                if aclose is not None:
                    await aclose()
