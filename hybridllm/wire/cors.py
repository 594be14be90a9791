"""CORS for both servers' ``--allow-origin``, with a refused preflight as OpenAI's JSON error.

Starlette's own refusal is a bare ``text/plain`` "Disallowed CORS origin"; a page's script (and the
person reading its console) gets instead what every other refusal says: what was refused and how
to allow it. The status (400) and the CORS headers stay Starlette's.
"""

from __future__ import annotations

from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.responses import Response

from .errors import WireError, header_value


class JsonErrorCORS(CORSMiddleware):
    """Starlette's CORS whose refused preflight is an OpenAI error; a server says what an origin
    not let in should do (:meth:`origin_refused`)."""

    def origin_refused(self, origin: str) -> WireError:
        shown = header_value(origin, 200)
        return WireError(f"This server does not answer web pages from {shown}. To let them call it, "
                         f"start the server with --allow-origin {shown}.", code="origin_not_allowed")

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code == 200:
            return response
        origin = request_headers["origin"]
        if not self.is_allowed_origin(origin):
            error = self.origin_refused(origin)
        else:  # a method this server has no route for
            method = header_value(request_headers["access-control-request-method"], 40)
            error = WireError(f"This server does not answer {method} requests from web pages (CORS "
                              "preflight): it answers GET and POST.", code="cors_not_allowed")
        headers = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
        return JSONResponse(error.body(), response.status_code, headers=headers)
