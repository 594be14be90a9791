"""Server-sent events that stop the producer when the client goes away.

Starlette's ``StreamingResponse`` only notices a vanished client when a write fails, which for
a request still waiting in the engine's queue may be much later. Here a watcher task reads the
ASGI ``receive`` channel; on ``http.disconnect`` it cancels the sending task, whose async
generator is then closed at once, so its ``finally`` aborts the engine request and frees its
KV blocks without waiting for the next token.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from hybridllm.wire.responses import DONE, sse_event

__all__ = ["DONE", "EventStreamResponse", "sse_event", "wait_for_disconnect"]


async def wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class EventStreamResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], headers: dict[str, str] | None = None) -> None:
        # Like StreamingResponse: no body, hence no Content-Length (chunked transfer instead).
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
        self.events = events

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for event in self.events:
            await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender = asyncio.ensure_future(self._send_all(send))
        watcher = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            await asyncio.wait({sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sender, watcher):
                task.cancel()
            # A failed write (OSError from the server) also means the client is gone.
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await sender
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                await aclose()
