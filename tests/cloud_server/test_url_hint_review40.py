"""A 404 for a path that misses ``/v1`` or doubles a slash names the route meant (review 40).

``openai.OpenAI(base_url="http://host:8000")`` (no ``/v1``: a common slip with OpenAI-compatible
servers) posts to ``/chat/completions``; a client that joins ``.../v1/`` and ``/chat/completions``
posts to ``/v1//chat/completions``. Both were a bare "Invalid URL (POST /chat/completions)", which
did not say what to change; the message now names the route and, for the first, the base URL.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cloud_server.api.server import create_app

from .api.fake_engine import FakeEngine
from .api.helpers import ThreadServer

openai = pytest.importorskip("openai")

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture()
def client() -> Iterator[Any]:
    with TestClient(create_app(lambda: FakeEngine(step_s=0.0))) as c:
        deadline = time.monotonic() + 10
        while c.get("/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        yield c


@pytest.mark.parametrize(
    ("method", "path", "meant"),
    [
        ("POST", "/chat/completions", "/v1/chat/completions"),
        ("POST", "/completions", "/v1/completions"),
        ("GET", "/models", "/v1/models"),
        ("GET", "/models/fake-model", "/v1/models/fake-model"),
    ],
)
def test_a_path_without_v1_names_the_route_and_the_base_url(
    client: Any, method: str, path: str, meant: str
) -> None:
    r = client.request(method, path, json=CHAT if method == "POST" else None)
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] is None
    assert error["message"] == (
        f"Invalid URL ({method} {path}); did you mean {method} {meant}? (an OpenAI client's base_url "
        "for this server ends in /v1: http://HOST:PORT/v1)"
    )


def test_a_doubled_slash_names_the_route(client: Any) -> None:
    r = client.post("/v1//chat/completions", json=CHAT)
    assert r.status_code == 404
    assert r.json()["error"]["message"] == (
        "Invalid URL (POST /v1//chat/completions); did you mean POST /v1/chat/completions?"
    )


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/v1/embeddings"), ("GET", "/nothing/here"), ("GET", "/chat/completions")]
)
def test_no_hint_where_no_route_fits(client: Any, method: str, path: str) -> None:
    """An unknown route, or one that fits only with another method, is the plain message."""
    r = client.request(method, path)
    assert r.status_code == 404
    assert r.json()["error"]["message"] == f"Invalid URL ({method} {path})"


def test_the_openai_client_without_v1_reads_the_hint() -> None:
    srv = ThreadServer(create_app(lambda: FakeEngine(step_s=0.0))).start()
    try:
        with openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0) as bad:
            with pytest.raises(openai.NotFoundError) as info:
                bad.chat.completions.create(**CHAT)
        assert "did you mean POST /v1/chat/completions?" in str(info.value)
    finally:
        srv.stop()
