"""The device proxy (`hybridllm serve`) answers a path that misses ``/v1`` as the cloud server does:
a 404 naming the route meant, and the base URL an OpenAI client needs (review 40). Before, only the
cloud server named it; the proxy's 404 was a bare "Invalid URL (POST /chat/completions)". Also: a
``top_p`` of 0 is refused as "must be > 0", not as an odd floor of 1.1754943508222875e-38."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def client() -> Iterator[Any]:
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "one two three"), cache=False)
    with TestClient(create_app(llm)) as c:
        yield c
    llm.close()


def test_a_path_without_v1_names_the_route_and_the_base_url(client: Any) -> None:
    r = client.post("/chat/completions", json=CHAT)
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "did you mean POST /v1/chat/completions?" in message, message
    assert "base_url" in message and "/v1" in message


def test_a_doubled_slash_names_the_route_without_the_base_url_note(client: Any) -> None:
    r = client.post("/v1//chat/completions", json=CHAT)
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "did you mean POST /v1/chat/completions?" in message, message
    assert "base_url" not in message


def test_an_unknown_path_gets_no_hint(client: Any) -> None:
    r = client.post("/v1/nothing/here", json=CHAT)
    assert r.status_code == 404
    assert "did you mean" not in r.json()["error"]["message"]


def test_a_zero_top_p_is_refused_as_not_above_zero(client: Any) -> None:
    r = client.post("/v1/chat/completions", json={**CHAT, "top_p": 0})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "top_p"
    assert "must be > 0" in error["message"], error["message"]
