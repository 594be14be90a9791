"""The one error both servers raise for a request they refuse, and OpenAI's error JSON.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "top_p", "code": null}}

``WireError`` is deliberately not a ``ValueError``: raised inside a pydantic validator it passes
through pydantic unchanged, so a model-level check keeps its ``param``.
"""

from __future__ import annotations

from typing import Any

# the answer of a server whose model is still loading (503 model_not_ready), on both servers
MODEL_LOADING = "The model is still loading; retry shortly."


class WireError(Exception):
    """A request the OpenAI wire format (or this server) does not accept: an HTTP 4xx."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code
        self.type = type
        # the response's own headers; a 408 (a body that came too slowly) hangs up: the rest of
        # that body is not waited for, so the connection cannot carry another request
        self.headers = dict(headers or {})
        if status == 408:
            self.headers.setdefault("Connection", "close")

    def body(self) -> dict[str, dict[str, Any]]:
        return error_body(self.message, self.type, param=self.param, code=self.code)


def error_body(
    message: str, type: str, *, param: str | None = None, code: str | None = None
) -> dict[str, dict[str, Any]]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def header_value(text: str, limit: int = 300) -> str:
    """``text`` made safe for an HTTP header: printable ASCII only, one line, at most ``limit``."""
    flat = " ".join(str(text).split())  # newlines and tabs become single spaces
    safe = "".join(ch if 32 <= ord(ch) < 127 else "?" for ch in flat)
    return safe[:limit]
