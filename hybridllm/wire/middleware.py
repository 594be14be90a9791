"""ASGI middleware both servers share (``hybridllm serve``, ``hybridllm-cloud``)."""

from __future__ import annotations

import copy
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._request_id import REQUEST_ID


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


# X-Request-Id (as vLLM and API gateways do): the client's when it is a plausible id, else a new one
MAX_REQUEST_ID_CHARS = 128
_REQUEST_ID_HEADER = b"x-request-id"


def request_id_of(given: str | None) -> str:
    """``given`` when it is 1 to ``MAX_REQUEST_ID_CHARS`` printable ASCII characters (a header value
    that is safe to send back and to write in a log line), else a new random id."""
    if given and len(given) <= MAX_REQUEST_ID_CHARS and given.isascii() and given.isprintable():
        return given
    return uuid.uuid4().hex


class RequestIdLog(logging.Filter):
    """Ends each line a server's logger writes while serving a request with `` [request_id=ID]``, so
    an error line can be found by the id the client got (and the cloud's by the proxy's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = REQUEST_ID.get()
        if rid is not None and not hasattr(record, "request_id"):
            record.request_id = rid
            record.msg, record.args = f"{record.getMessage()} [request_id={rid}]", ()
        return True


_REQUEST_ID_LOG = RequestIdLog()


class AccessRequestId(logging.Filter):
    """Gives uvicorn's access records a ``request_id`` (``-`` outside a request). uvicorn writes the
    access line from the app's ``send``, inside ``RequestId``, so the id is the one sent back. Its
    AccessFormatter reads the record's args, so ``RequestIdLog``'s rewrite of the message cannot
    serve here: the line's format names the field (``access_log_config``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get() or "-"
        return True


def access_log_config() -> dict[str, Any]:
    """uvicorn's logging config, its access line ending with `` [request_id=ID]`` as the server's
    own lines do (``log_config`` of ``uvicorn.Config``)."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["request_id"] = {"()": AccessRequestId}
    config["formatters"]["access"]["fmt"] += " [request_id=%(request_id)s]"
    config["handlers"]["access"].setdefault("filters", []).append("request_id")
    return config


class RequestId:
    """ASGI middleware: each HTTP request gets an id (``request_id_of`` its ``X-Request-Id``), held in
    ``REQUEST_ID`` while it is served (the cloud backend forwards it, ``log_names`` name it) and sent
    back as the ``X-Request-Id`` header of its answer, whatever answers: a route, an error handler, a
    middleware's refusal. Added last, it is outside every other middleware of the app."""

    def __init__(self, app: ASGIApp, log_names: tuple[str, ...] = ()) -> None:
        self.app = app
        for name in log_names:
            logging.getLogger(name).addFilter(_REQUEST_ID_LOG)  # once per logger: the same filter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == _REQUEST_ID_HEADER), None)
        rid = request_id_of(None if given is None else given.decode("latin-1"))

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != _REQUEST_ID_HEADER]
                message = {**message, "headers": [*headers, (_REQUEST_ID_HEADER, rid.encode("ascii"))]}
            await send(message)

        token = REQUEST_ID.set(rid)
        try:
            await self.app(scope, receive, tagged)
        finally:
            REQUEST_ID.reset(token)
