"""ASGI middleware both servers share (``hybridllm serve``, ``hybridllm-cloud``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class AnswerUnexpected:
    """ASGI middleware: an exception no handler took becomes ``handler``'s answer (the 500 JSON).
    Starlette runs the handler of ``Exception`` in its outermost
    middleware, which answers and then re-raises for uvicorn to log a traceback ("Exception in ASGI
    application") with the exception's text, which may quote the prompt. Once the response has
    started nothing can be answered: it is re-raised as before."""

    def __init__(self, app: ASGIApp, handler: Callable[[Request, Exception], Awaitable[Any]]) -> None:
        self.app = app
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            if started:
                raise
            response = await self.handler(Request(scope), exc)
            await response(scope, receive, send)
