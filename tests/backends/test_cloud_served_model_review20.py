"""A cloud answer reports the model the server says answered (its ``model`` field: OpenAI answers
"gpt-4o" as "gpt-4o-2024-08-06"), as LiteLLM and the openai client do; the name asked for stays the
backend's and the cache key's, and stands when the server names none (review 20)."""

from __future__ import annotations

import json

import httpx
import pytest

from hybridllm import HybridLLM
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend

SERVED = "gpt-4o-2024-08-06"


def sse(events: list[dict]) -> httpx.Response:
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


def chunks(model: object, text: str = "hello there") -> list[dict]:
    named = {} if model is ... else {"model": model}
    return [{**named, "choices": [{"delta": {"content": text[:5]}, "finish_reason": None}]},
            {**named, "choices": [{"delta": {"content": text[5:]}, "finish_reason": None}]},
            {**named, "choices": [{"delta": {}, "finish_reason": "stop"}]},
            {**named, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}]


def whole(model: object, text: str = "hello there") -> httpx.Response:
    body = {"choices": [{"message": {"content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    if model is not ...:
        body["model"] = model
    return httpx.Response(200, json=body)


def client(answer, *, model: str | None = "gpt-4o", asked: list | None = None) -> HybridLLM:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "listed"}]})
        body = json.loads(request.content)
        if asked is not None:
            asked.append(body["model"])
        if "stop" in body:  # a reasoning model: the client cuts at the stop sequences itself
            return httpx.Response(400, json={"error": {
                "message": "Unsupported parameter: 'stop' is not supported with this model.",
                "param": "stop", "type": "invalid_request_error"}})
        return answer()

    cloud = CloudBackend(base_url="http://c.test", model=model, transport=httpx.MockTransport(handler),
                         remember_refusals=False)
    return HybridLLM(edge=FakeBackend(model="edge-model"), cloud=cloud, cache=False)


def run(llm: HybridLLM, **params):
    try:
        streamed = list(llm.stream("hi", route="cloud", **params))
        c = llm.chat("hi", route="cloud", **params)
    finally:
        llm.close()
    return streamed, c


def test_streamed_answer_names_the_model_the_server_says_answered():
    asked: list = []
    llm = client(lambda: sse(chunks(SERVED)), asked=asked)
    cloud = llm._core.cloud
    cache_model = llm._core.cache_model
    streamed, c = run(llm)
    # before: every chunk and the completion said "gpt-4o", the name asked for
    assert {ch.model for ch in streamed} == {SERVED}
    assert streamed[-1].completion.model == SERVED and c.model == SERVED
    assert c.text == "hello there"
    # what is asked, the backend's name and the cache key stay on the name configured
    assert asked == ["gpt-4o", "gpt-4o"]
    assert cloud.model == "gpt-4o" and llm._core.cache_model == cache_model


def test_whole_json_answer_names_the_model_the_server_says_answered():
    streamed, c = run(client(lambda: whole(SERVED)))
    assert {ch.model for ch in streamed} == {SERVED}
    assert c.model == SERVED and c.text == "hello there"


@pytest.mark.parametrize("answer", [sse, whole], ids=["stream", "json"])
def test_the_served_name_stays_when_the_client_cuts_at_a_stop_sequence(answer):
    make = (lambda: sse(chunks(SERVED))) if answer is sse else (lambda: whole(SERVED))
    streamed, c = run(client(make), stop=["there"])
    assert c.text == "hello " and c.finish_reason == "stop"
    assert {ch.model for ch in streamed} == {SERVED} and c.model == SERVED


@pytest.mark.parametrize("named", [..., None, "", "   ", 42, ["x"], "x" * 1025, "bad\nname", "a\x1b[2Jb"],
                         ids=["absent", "null", "empty", "blank", "number", "list", "too-long",
                              "newline", "escape"])
@pytest.mark.parametrize("answer", [sse, whole], ids=["stream", "json"])
def test_no_usable_name_in_the_answer_keeps_the_name_asked_for(named, answer):
    make = (lambda: sse(chunks(named))) if answer is sse else (lambda: whole(named))
    streamed, c = run(client(make))
    assert {ch.model for ch in streamed} == {"gpt-4o"} and c.model == "gpt-4o"
    assert c.text == "hello there"


def test_the_longest_name_the_wire_takes_is_reported():
    name = "m" * 1024
    _, c = run(client(lambda: sse(chunks(name))))
    assert c.model == name


def test_a_discovered_model_is_asked_for_and_the_served_one_reported():
    asked: list = []
    llm = client(lambda: sse(chunks("listed-v2")), model=None, asked=asked)
    cloud = llm._core.cloud
    cache_model = llm._core.cache_model
    _, c = run(llm)
    assert c.model == "listed-v2"  # before: "listed", the name /v1/models gave
    assert asked == ["listed", "listed"] and cloud.model == "listed"
    assert llm._core.cache_model == cache_model


def test_the_bound_is_the_wire_models():
    pytest.importorskip("pydantic")
    from hybridllm.backends.cloud_stream import MAX_MODEL_CHARS
    from hybridllm.wire.requests import MAX_MODEL_CHARS as WIRE

    assert MAX_MODEL_CHARS == WIRE
