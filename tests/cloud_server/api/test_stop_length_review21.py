"""A stop string's length is bounded (``MAX_STOP_CHARS``) on the cloud server, through the shared
request model: a megabyte-long one held back the whole stream (the last len(stop)-1 characters wait,
since they may begin it) and was searched every step. Beyond the bound: OpenAI's 400, param "stop"."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from cloud_server.api.server import create_app
from hybridllm.wire.requests import MAX_STOP_CHARS

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


def test_the_bound_is_generous_and_finite() -> None:
    assert 256 <= MAX_STOP_CHARS <= 4096


@pytest.mark.parametrize(("stop", "where"), [
    ("x" * (MAX_STOP_CHARS + 1), "stop is"),
    (["\n", "y" * 1_000_000], "stop[1] is 1000000"),
])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_an_overlong_stop_string_is_a_400_naming_stop(http: TestClient, path: str, stop, where) -> None:
    body = CHAT if path.endswith("chat/completions") else {"model": "fake-model", "prompt": "hi"}
    r = http.post(path, json={**body, "stop": stop})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "stop" and err["type"] == "invalid_request_error"
    assert where in err["message"] and str(MAX_STOP_CHARS) in err["message"]


def test_a_stop_string_at_the_bound_is_served(http: TestClient) -> None:
    r = http.post("/v1/chat/completions", json={**CHAT, "stop": ["z" * MAX_STOP_CHARS, "q"]})
    assert r.status_code == 200, r.text


def test_other_stop_errors_are_unchanged(http: TestClient) -> None:
    r = http.post("/v1/chat/completions", json={**CHAT, "stop": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"


def test_the_openapi_document_states_the_bound(http: TestClient) -> None:
    schemas = http.get("/openapi.json").json()["components"]["schemas"]
    stop = next(s["properties"]["stop"] for name, s in schemas.items()
                if "ChatCompletionRequest" in name and "stop" in s.get("properties", {}))
    strings = [m for m in stop["anyOf"] if m.get("type") == "string"]
    lists = [m for m in stop["anyOf"] if m.get("type") == "array"]
    assert strings[0]["maxLength"] == MAX_STOP_CHARS
    assert lists[0]["items"]["maxLength"] == MAX_STOP_CHARS
