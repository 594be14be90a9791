"""`hybridllm serve` while its model loads: the port answers at once, with a 503 ``loading``.

The port is bound before the model loads (a port in use fails at once), but the app can serve only
once the model is ready. Meanwhile every request (a health probe, a chat UI listing the models)
used to hang with no answer for as long as the load took, minutes for a first download. As the
cloud server does while it loads, each request now gets a 503 at once: ``/health`` (and ``HEAD``)
``{"status": "loading"}``, any other path OpenAI's error ``model_not_ready``, with ``Retry-After``.
A small standard-library HTTP server answers on the bound socket from its own thread; it stops
before uvicorn takes the socket over, so no request is left between the two.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from .wire import error_body
from .wire.errors import MODEL_LOADING
from .wire.middleware import request_id_of

LOADING = MODEL_LOADING  # the cloud server's words
# a load takes seconds (a model on disk) to minutes (a first download): ask again in a few seconds
LOADING_RETRY_AFTER_S = 5
READ_TIMEOUT_S = 5.0  # a client that sends nothing holds only its own thread, this long


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = READ_TIMEOUT_S
    server: _LoadingServer

    def _answer(self) -> None:
        self._discard_body()
        if urlsplit(self.path).path.rstrip("/") == "/health":
            payload: dict[str, Any] = {"status": "loading"}
        else:
            payload = error_body(LOADING, "server_error", code="model_not_ready")
        data = json.dumps(payload).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Retry-After", str(LOADING_RETRY_AFTER_S))
        self.send_header("X-Request-Id", request_id_of(self.headers.get("x-request-id")))
        self.send_header("Connection", "close")  # the next request reaches the app once it serves
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.close_connection = True

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _answer

    def _discard_body(self) -> None:
        """Read the request's body before answering: closed with unread bytes, the connection is
        reset, and the client may see that rather than the 503. A body past the server's limit (or
        one sent in chunks) is left: the 503 goes out, and the client may see the reset."""
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            return
        if 0 < length <= self.server.max_body_bytes:
            self.rfile.read(length)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Silent: the model's progress bar is drawn meanwhile; uvicorn's access log starts later."""


class _LoadingServer(ThreadingMixIn, HTTPServer):
    daemon_threads = True  # a slow client never holds the switch to the app, nor the exit

    def __init__(self, sock: socket.socket, max_body_bytes: int) -> None:
        # the socket is the one bound already (and later uvicorn's): not bound, nor closed, here
        super().__init__(sock.getsockname()[:2], _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.max_body_bytes = max_body_bytes

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up or timed out mid-request: nobody to tell, and no traceback."""


class LoadingAnswers:
    """``with LoadingAnswers(sock):`` the 503 ``loading`` answers on ``sock`` for the block."""

    def __init__(self, sock: socket.socket, max_body_bytes: int) -> None:
        self._server = _LoadingServer(sock, max_body_bytes)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="hybridllm-serve-loading", daemon=True)

    def __enter__(self) -> LoadingAnswers:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # no new connection is taken once this returns; the ones taken get their 503 on their threads
        self._server.shutdown()
        self._thread.join()
