"""`hybridllm serve` review 15b (fakes only): duplicate JSON keys are a 400 on both servers (the
shared decoder), an unexpected error is answered as the 500 JSON without being re-raised to the
server (uvicorn's traceback with the error's text), and HEAD /health answers as GET does."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402
from hybridllm.wire import WireError, decode_json_object  # noqa: E402

CHAT = "/v1/chat/completions"


@pytest.fixture
def llm() -> Iterator[HybridLLM]:
    client = HybridLLM(edge=FakeBackend(reply=lambda m: "one two three"), cache=False)
    yield client
    client.close()


@pytest.fixture
def http(llm: HybridLLM) -> Iterator[TestClient]:
    # raise_server_exceptions: an exception that reaches the server fails the test, as uvicorn
    # would log it with a traceback
    with TestClient(create_app(llm), raise_server_exceptions=True) as client:
        yield client


def post_raw(http: TestClient, body: bytes):
    return http.post(CHAT, content=body, headers={"content-type": "application/json"})


@pytest.mark.parametrize("body", [
    b'{"model":"x","messages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}]}',
    b'{"model":"x","messages":[{"role":"user","content":"a","content":"b"}]}',
    b'{"model":"x","max_tokens":1,"messages":[{"role":"user","content":"a"}],"max_tokens":9}',
])
def test_a_key_twice_is_a_400_not_the_last_one_silently(http, body):
    r = post_raw(http, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "twice" in error["message"]


def test_decoder_names_the_repeated_key_and_keeps_distinct_ones():
    with pytest.raises(WireError) as info:
        decode_json_object(b'{"a": {"b": 1, "b": 2}}')
    assert info.value.status == 400 and "'b'" in info.value.message
    # the same key in two different objects is no repeat
    assert decode_json_object(b'{"a": {"b": 1}, "c": {"b": 2}}') == {"a": {"b": 1}, "c": {"b": 2}}
    # a repeated key holding a lone surrogate is named escaped (the 400 itself must encode)
    with pytest.raises(WireError, match=r"\\ud800"):
        decode_json_object(b'{"\\ud800": 1, "\\ud800": 2}')


def test_an_unexpected_error_is_answered_not_reraised(http, llm, monkeypatch, caplog):
    def broken() -> dict:
        raise ZeroDivisionError("text of the prompt")

    monkeypatch.setattr(llm, "stats", broken)
    r = http.get("/stats")  # the old app re-raised the error after answering
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "server_error"
    assert "text of the prompt" not in r.text and "text of the prompt" not in caplog.text


def test_an_unexpected_error_in_chat_is_a_500_json(http, monkeypatch):
    import hybridllm.proxy as proxy

    def broken(*args, **kwargs):
        raise KeyError("secret")

    monkeypatch.setattr(proxy, "_completion_json", broken)
    r = http.post(CHAT, json={"model": "x", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 500 and r.json()["error"]["message"].startswith("The server had an error")
    # the app still answers afterwards
    assert http.get("/health").status_code == 200


def test_head_health_answers_like_get(http, llm):
    assert http.head("/health").status_code == 200
    assert "/health" in http.get("/openapi.json").json()["paths"]
    assert "head" not in http.get("/openapi.json").json()["paths"]["/health"]


def test_requests_on_fresh_event_loops_are_not_refused_as_shutting_down(llm):
    # a TestClient used without ``with`` runs each request on a loop of its own: the drain's
    # asyncio.Event, bound to the first, made every later request a 503 "shutting down"
    client = TestClient(create_app(llm), raise_server_exceptions=True)
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
    for stream in (False, True, False, True):
        r = client.post(CHAT, json={**body, "stream": stream})
        assert r.status_code == 200, r.text
        assert "error" not in r.text and (r.text.endswith("data: [DONE]\n\n") if stream else
                                          r.json()["choices"][0]["message"]["content"] == "one two three")


def test_drain_expiry_reaches_every_loop():
    import asyncio

    from hybridllm.wire.shutdown import Drain

    drain = Drain()

    async def expired() -> bool:
        return drain.expired.is_set()

    assert asyncio.run(expired()) is False  # an Event bound to this first loop
    asyncio.run(drain.run(0.0, settle_s=0.0))  # a second loop drains
    assert asyncio.run(expired()) is True  # and a third sees it
