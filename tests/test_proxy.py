"""The local proxy's HTTP layer on a fake backend (fast); the real one is in e2e/."""

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402


@pytest.fixture
def http():
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "one two three"), cache=False)
    return TestClient(create_app(llm))


def test_chat_json_and_route_header(http):
    r = http.post("/v1/chat/completions",
                  json={"model": "x", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.headers["x-hybridllm-route"] == "edge"
    body = r.json()
    assert body["choices"][0]["message"]["content"] == "one two three"
    assert body["hybridllm"]["route"] == "edge" and body["usage"]["completion_tokens"] == 3


def test_stream_sse_ends_with_done_and_usage(http):
    r = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": True}})
    lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    events = [json.loads(x) for x in lines[:-1]]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == "one two three"
    assert events[-1]["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("body, word", [
    (b"{not json", "not valid JSON"),
    (b'{"messages": []}', "empty"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -2}', "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', "temperature"),
    (b'[1, 2]', "JSON object"),
])
def test_bad_requests_are_openai_errors(http, body, word):
    r = http.post("/v1/chat/completions", content=body,
                  headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and word in err["message"]


def test_models_and_stats(http):
    ids = [m["id"] for m in http.get("/v1/models").json()["data"]]
    assert ids == ["hybridllm", "fake-model"]
    http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert http.get("/stats").json()["requests"] == 1
