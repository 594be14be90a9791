"""A cloud model that refuses answers with its words in ``refusal`` (OpenAI: ``delta.refusal`` when
streamed, ``message.refusal`` in a whole completion) and ``content`` null. Those words are the
answer's text: before, the answer read as "" with finish_reason "stop" and nothing said it was
refused (review 20)."""

from __future__ import annotations

import json

import httpx
import pytest

from hybridllm import HybridLLM
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend

REFUSAL = "I'm sorry, I can't help with that."


def sse(events: list[dict]) -> httpx.Response:
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


def refused_stream() -> httpx.Response:
    # OpenAI's chunks of a refusal: content null, the words in pieces of delta.refusal
    pieces = [REFUSAL[:9], REFUSAL[9:20], REFUSAL[20:]]
    return sse([{"choices": [{"delta": {"role": "assistant", "content": None, "refusal": ""},
                              "finish_reason": None}]},
                *({"choices": [{"delta": {"content": None, "refusal": p}, "finish_reason": None}]}
                  for p in pieces),
                {"choices": [{"delta": {}, "finish_reason": "stop"}]},
                {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}}])


def refused_whole() -> httpx.Response:
    return httpx.Response(200, json={
        "choices": [{"message": {"role": "assistant", "content": None, "refusal": REFUSAL},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 9}})


def answered_whole() -> httpx.Response:  # content and a null refusal, as every OpenAI answer has
    return httpx.Response(200, json={
        "choices": [{"message": {"role": "assistant", "content": "hello", "refusal": None},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1}})


def client(answer) -> HybridLLM:
    def handler(request: httpx.Request) -> httpx.Response:
        return answer()

    cloud = CloudBackend(base_url="http://c.test", model="gpt-4o", transport=httpx.MockTransport(handler),
                         remember_refusals=False)
    return HybridLLM(edge=FakeBackend(model="edge-model"), cloud=cloud, cache=False)


def run(llm: HybridLLM):
    try:
        streamed = [ch.text for ch in llm.stream("How do I pick a lock?", route="cloud")]
        c = llm.chat("How do I pick a lock?", route="cloud")
    finally:
        llm.close()
    return streamed, c


@pytest.mark.parametrize("answer", [refused_stream, refused_whole], ids=["stream", "json"])
def test_a_refusal_is_the_answers_text(answer):
    streamed, c = run(client(answer))
    assert "".join(streamed) == REFUSAL  # before: ""
    assert c.text == REFUSAL and c.finish_reason == "stop" and c.route == "cloud"
    assert c.usage.completion_tokens == 9


def test_a_streamed_refusal_comes_piece_by_piece():
    streamed, _ = run(client(refused_stream))
    assert [t for t in streamed if t] == [REFUSAL[:9], REFUSAL[9:20], REFUSAL[20:]]


def test_an_answer_with_a_null_refusal_is_its_content():
    _, c = run(client(answered_whole))
    assert c.text == "hello"


def test_a_refusal_that_is_not_text_is_a_malformed_event():
    from hybridllm.backends.cloud_stream import _read_event
    with pytest.raises(TypeError, match="refusal"):
        _read_event({"choices": [{"delta": {"refusal": 5}}]})
