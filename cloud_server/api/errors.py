"""Map exception types to OpenAI's error JSON and HTTP status.

    {"error": {"message": "...", "type": "invalid_request_error", "param": null, "code": null}}

The mapping is by type only (the tree in ``cloud_server.exceptions``); messages are never parsed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from cloud_server.exceptions import (
    AuthError,
    ContextLengthError,
    EngineDeadError,
    InvalidRequestError,
    ModelNotFoundError,
    NotReadyError,
    QueueFullError,
    ServerError,
    ShuttingDownError,
)
from hybridllm.wire.errors import WireError
from hybridllm.wire.middleware import AnswerUnexpected
from hybridllm.wire.sse import on_client_disconnect
from hybridllm.wire.urls import url_hint

logger = logging.getLogger("cloud_server.api")


@dataclass(frozen=True)
class ErrorKind:
    status: int
    type: str
    code: str | None = None


# Most specific first: ContextLengthError is an InvalidRequestError.
_KINDS: list[tuple[type[ServerError], ErrorKind]] = [
    (ContextLengthError, ErrorKind(400, "invalid_request_error", "context_length_exceeded")),
    (InvalidRequestError, ErrorKind(400, "invalid_request_error")),
    (AuthError, ErrorKind(401, "invalid_request_error", "invalid_api_key")),
    (ModelNotFoundError, ErrorKind(404, "invalid_request_error", "model_not_found")),
    (QueueFullError, ErrorKind(429, "requests", "rate_limit_exceeded")),
    (NotReadyError, ErrorKind(503, "server_error", "model_not_ready")),
    (ShuttingDownError, ErrorKind(503, "server_error", "server_shutting_down")),
    (EngineDeadError, ErrorKind(500, "server_error", "engine_dead")),
]
_INTERNAL = ErrorKind(500, "server_error")


def error_kind(exc: BaseException) -> ErrorKind:
    if isinstance(exc, WireError):
        return ErrorKind(exc.status, exc.type, exc.code)
    for exc_type, kind in _KINDS:
        if isinstance(exc, exc_type):
            return kind
    return _INTERNAL


def error_body(message: str, kind: ErrorKind, *, param: str | None = None) -> dict[str, dict[str, Any]]:
    return {"error": {"message": message, "type": kind.type, "param": param, "code": kind.code}}


def error_response(exc: BaseException) -> JSONResponse:
    kind = error_kind(exc)
    if kind is _INTERNAL:
        # The type only: an exception's text may quote the request (prompt text stays out of
        # the logs unless debug logging is on).
        logger.error("internal error: %s", type(exc).__name__,
                     exc_info=exc if logger.isEnabledFor(logging.DEBUG) else None)
        message = "The server had an error while processing your request."
    else:
        message = str(exc)
    headers: dict[str, str] = {}
    if isinstance(exc, QueueFullError):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    if isinstance(exc, AuthError) or kind.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    param = getattr(exc, "param", None)
    return JSONResponse(error_body(message, kind, param=param), kind.status, headers=headers)


def validation_error(exc: ValidationError | RequestValidationError) -> InvalidRequestError:
    """The first pydantic error as one readable message, with the offending field as ``param``."""
    errors = exc.errors()
    if not errors:
        return InvalidRequestError("Invalid request.")
    # An unknown field is the most useful thing to report (often a typo of a known one).
    first = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    elif first.get("type") in ("json_invalid", "json_type"):
        return InvalidRequestError("The request body is not valid JSON.")
    elif first.get("type") == "missing":
        message = f"Missing required parameter: '{param}'."
    else:
        message = f"Invalid value for '{param}': {first.get('msg', 'invalid')}."
    return InvalidRequestError(message, param=param)


def _allowed(exc: StarletteHTTPException) -> str:
    """The 405's ``Allow`` value, with HEAD wherever GET is: Starlette names only the methods of the
    first route on the path ("GET"), while every GET route here has a HEAD twin (RFC 9110; as
    Starlette's own ``Route`` adds it)."""
    methods = [m.strip() for m in (exc.headers or {}).get("Allow", "").split(",") if m.strip()]
    if "GET" in methods and "HEAD" not in methods:
        methods.append("HEAD")
    return ", ".join(methods)


def install_error_handlers(app: FastAPI, *, on_status: Callable[[int], None] | None = None) -> None:
    """Answer every error as OpenAI JSON; ``on_status`` sees the status of each (for metrics)."""

    def counted(response: JSONResponse) -> JSONResponse:
        if on_status is not None:
            on_status(response.status_code)
        return response

    async def on_server_error(request: Request, exc: Exception) -> JSONResponse:
        return counted(error_response(exc))

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, RequestValidationError):
            return counted(error_response(exc))
        return counted(error_response(validation_error(exc)))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, StarletteHTTPException):
            return counted(error_response(exc))
        headers = exc.headers
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path}){url_hint(request)}"
        elif exc.status_code == 405:
            message = f"Method Not Allowed ({request.method} {request.url.path})"
            allowed = _allowed(exc)
            if allowed:
                message += f"; allowed: {allowed}"
                headers = {**(exc.headers or {}), "Allow": allowed}
        else:
            message = str(exc.detail)
        kind = ErrorKind(exc.status_code, "invalid_request_error")
        return counted(JSONResponse(error_body(message, kind), exc.status_code, headers=headers))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        return counted(error_response(exc))

    app.add_exception_handler(ServerError, on_server_error)
    app.add_exception_handler(WireError, on_server_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(ClientDisconnect, on_client_disconnect)
    app.add_exception_handler(Exception, on_unexpected)
    # Starlette runs the handler of ``Exception`` in its outermost middleware, which answers and
    # then re-raises for the server to log: uvicorn's "Exception in ASGI application" traceback,
    # with the exception's text (which may quote the prompt) that ``error_response`` keeps out of
    # the log, and a second error line. A route's unexpected error is answered here instead, just
    # outside the router, and ends there; the handler above stays for what fails further out.
    app.add_middleware(AnswerUnexpected, handler=on_unexpected)
