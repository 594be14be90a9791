"""``"content": []`` (an empty list of content parts) is OpenAI's 400 ``empty_array`` on the cloud
server, naming the message; it was a 200 answering an empty turn (``hybridllm serve`` and the library
already refuse it)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from cloud_server.api.server import create_app

from .fake_engine import FakeEngine

HI = {"role": "user", "content": "hi"}


@pytest.fixture(scope="module")
def http() -> Iterator[TestClient]:
    engine = FakeEngine(step_s=0.0, max_model_len=128)
    with TestClient(create_app(lambda: engine)) as client:
        deadline = time.monotonic() + 10
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the fake engine did not come up"
            time.sleep(0.01)
        yield client


@pytest.mark.parametrize(("messages", "index"), [
    ([{"role": "user", "content": []}], 0),
    ([{"role": "system", "content": []}, HI], 0),
    ([HI, {"role": "assistant", "content": []}, HI], 1),
])
def test_an_empty_list_of_parts_is_openais_400(http: TestClient, messages, index: int) -> None:
    r = http.post("/v1/chat/completions", json={"model": "fake-model", "messages": messages, "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == f"messages[{index}].content" and err["code"] == "empty_array"
    assert "empty array" in err["message"]


def test_parts_with_text_and_a_null_assistant_turn_are_served(http: TestClient) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": None}, HI]
    r = http.post("/v1/chat/completions", json={"model": "fake-model", "messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text
