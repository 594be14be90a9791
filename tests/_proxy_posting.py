"""``hybridllm serve``'s app over a client with a given device model, for fast proxy tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from hybridllm import HybridLLM


@contextmanager
def posting(edge: Any, messages: list[dict], **client: Any) -> Iterator[tuple[Callable[..., Any], Any]]:
    """Yields ``(post, http)``: ``post(**fields)`` sends a chat request of ``messages`` with
    ``fields`` to the app (a fastapi TestClient, ``http``) of a HybridLLM over ``edge``."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    llm = HybridLLM(edge=edge, cache=False, **client)
    try:
        with TestClient(create_app(llm)) as http:

            def post(**fields: object) -> Any:
                return http.post("/v1/chat/completions", json={"model": "x", "messages": messages, **fields})

            yield post, http
    finally:
        llm.close()
