"""CORS for the web pages an operator lets call this server from a browser (``--allow-origin``).

Off unless origins are given: without it a browser keeps any page from reading the answers and its
preflight (``OPTIONS``, sent before a POST with ``Authorization``) is refused. The key is still
checked on every request; the origin list only decides which pages may read what comes back.
"""

from __future__ import annotations

from fastapi import FastAPI

from hybridllm.wire.cors import JsonErrorCORS

# the headers a page's script may read: the request's id (for a bug report), when to retry a 429/503
EXPOSED = ["x-request-id", "retry-after"]


def add_cors(app: FastAPI, origins: list[str]) -> None:
    """Let pages from ``origins`` (``*``: any) call ``app`` from a browser. Any request header is
    allowed (the openai JS client sends x-stainless-* ones); credentials are a Bearer key, not
    cookies, so none are allowed. A refused preflight is OpenAI's JSON error naming the fix."""
    if origins:
        app.add_middleware(JsonErrorCORS, allow_origins=[o.rstrip("/") for o in origins],
                           allow_methods=["GET", "POST"], allow_headers=["*"], expose_headers=EXPOSED)
