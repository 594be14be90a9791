"""The cloud server over HTTP with the shared request model's edge cases: a blank ``model`` is a 400
(OpenAI's "you must provide a model parameter"), not a 404 quoting an empty name; a stop list longer
than OpenAI's 4 is served (vLLM takes any; IDE plugins send 9 and more); a body that is not UTF-8 is
told so, not asked for the Content-Type it had sent."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from cloud_server.api.server import create_app

from .fake_engine import FakeEngine

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def http() -> Iterator[TestClient]:
    engine = FakeEngine(step_s=0.0, max_model_len=128)
    with TestClient(create_app(lambda: engine)) as client:
        deadline = time.monotonic() + 10
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the fake engine did not come up"
            time.sleep(0.01)
        yield client


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_blank_model_is_a_400_not_a_404(http: TestClient, path: str) -> None:
    body = dict(CHAT) if path.endswith("chat/completions") else {"model": "fake-model", "prompt": "hi"}
    r = http.post(path, json={**body, "model": ""})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "model" and "must provide a model" in err["message"]


def test_nine_stop_strings_are_served(http: TestClient) -> None:
    r = http.post("/v1/chat/completions", json={**CHAT, "stop": [f"zz{i}" for i in range(9)]})
    assert r.status_code == 200, r.text


def test_a_latin1_body_is_told_it_is_not_utf8(http: TestClient) -> None:
    body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "caf\xe9"}]}'
    r = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert "not valid UTF-8" in r.json()["error"]["message"]
