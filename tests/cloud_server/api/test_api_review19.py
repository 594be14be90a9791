"""Review 19 of the cloud server's OpenAI API (fake engine, in-process client):

- a legacy ``prompt`` of the wrong type (``null``, a number, ``true``, an object) was a 400 whose
  ``param`` was ``prompt.constrained-str`` (pydantic's name of the union member), no field of the
  request; now ``prompt``;
- ``GET /v1/models/{id}`` answered a card without the ``max_model_len`` the list's card carries
  (the same model, two shapes); now the list's card;
- after a failed load (no ``on_load_error`` to end the process) every ``/v1`` request got 503 "The
  model is still loading; retry shortly." for ever, and after the engine stopped "retry shortly"
  too, while ``/health`` said ``error``: neither comes back without a restart, which the message
  now says."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from cloud_server.api.protocol import CloudCompletionRequest, parse_request
from cloud_server.api.server import create_app
from hybridllm.wire.errors import WireError

from .fake_engine import FakeEngine

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _wait(http: TestClient, status: int) -> None:
    deadline = time.monotonic() + 10
    while http.get("/health").status_code != status:
        assert time.monotonic() < deadline, "the server did not reach the expected health"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[TestClient, FakeEngine]]:
    engine = FakeEngine(step_s=0.0, max_model_len=128)
    with TestClient(create_app(lambda: engine)) as http:
        _wait(http, 200)
        yield http, engine


@pytest.mark.parametrize("prompt", [None, 5, True, {"text": "hi"}, 1.5])
def test_a_prompt_of_the_wrong_type_names_prompt(prompt: object) -> None:
    with pytest.raises(WireError) as info:
        parse_request(CloudCompletionRequest, {"model": "m", "prompt": prompt})
    assert info.value.param == "prompt"
    assert "constrained" not in str(info.value)


def test_a_prompt_of_the_wrong_type_over_http(served: tuple[TestClient, FakeEngine]) -> None:
    http, _ = served
    r = http.post("/v1/completions", json={"model": "fake-model", "prompt": None})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "prompt" and error["type"] == "invalid_request_error"
    assert error["message"].startswith("Invalid value for 'prompt':")


def test_one_model_card_is_the_lists_card(served: tuple[TestClient, FakeEngine]) -> None:
    http, engine = served
    listed = http.get("/v1/models").json()["data"]
    card = http.get("/v1/models/fake-model")
    assert card.status_code == 200
    assert card.json() == listed[0]
    assert card.json()["max_model_len"] == engine.max_model_len == 128


def test_a_failed_load_is_not_called_loading() -> None:
    def broken() -> FakeEngine:
        raise RuntimeError("no weights")

    with TestClient(create_app(broken)) as http:
        deadline = time.monotonic() + 10
        while http.get("/health").json()["status"] != "error":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for r in (http.post("/v1/chat/completions", json=CHAT), http.get("/v1/models")):
            assert r.status_code == 503
            error = r.json()["error"]
            assert error["code"] == "model_not_ready"
            assert "failed to load (RuntimeError)" in error["message"]
            assert "retry shortly" not in error["message"] and "no weights" not in error["message"]


def test_a_stopped_engine_is_not_called_retry_shortly() -> None:
    engine = FakeEngine(step_s=0.0)
    with TestClient(create_app(lambda: engine)) as http:
        _wait(http, 200)
        engine.is_ready = False  # its loop ended by itself; no on_engine_dead: 503 until restarted
        assert http.get("/health").json() == {"status": "error"}
        r = http.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503
        assert "restarted" in r.json()["error"]["message"]
        assert "retry shortly" not in r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_model_name_past_the_bound_is_a_400_that_does_not_quote_it(
        served: tuple[TestClient, FakeEngine], path: str) -> None:
    """The 404 for an unknown model quoted the name whole (a 3 MB name, a 3 MB error); the bound is
    the proxy's, in the shared request model (hybridllm.wire.requests.MAX_MODEL_CHARS)."""
    http, _ = served
    body = dict(CHAT) if path.endswith("chat/completions") else {"model": "", "prompt": "hi"}
    body["model"] = "m" * 100_000
    r = http.post(path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert len(r.content) < 2_000
