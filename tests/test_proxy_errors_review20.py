"""`hybridllm serve`'s errors and shutdown, as OpenAI's clients read them. Fakes, fast.

- A prompt past the device's context is OpenAI's 400 ``context_length_exceeded`` with
  ``param: "messages"`` (was null).
- The shutdown's 503 (a request arriving while the server drains, and /health then) says when to
  retry, as every 429 and 503 of the proxy does (was no Retry-After).
- An assistant turn echoed back with ``content: null`` and its ``refusal`` (the official client's
  ``message.model_dump()`` of a refused answer) reaches the model as the refusal text (was an
  empty assistant turn).
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm._proxy_request import ProxyChatRequest  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402
from tests.test_context_window import LONG, client  # noqa: E402

REFUSAL = "I can't help with that."


def test_a_prompt_past_the_context_names_the_messages():
    llm, _ = client()
    body = {"model": "x", "messages": [{"role": "user", "content": LONG}]}
    try:
        with TestClient(create_app(llm)) as http:
            for stream in (False, True):
                r = http.post("/v1/chat/completions", json={**body, "stream": stream})
                error = r.json()["error"]
                assert r.status_code == 400 and error["code"] == "context_length_exceeded"
                assert error["param"] == "messages", error
    finally:
        llm.close()


def test_the_shutdowns_503_says_when_to_retry():
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "hi"), cache=False)
    app = create_app(llm)
    try:
        with TestClient(app) as http:
            app.state.drain.is_closing = True  # SIGTERM: the server drains
            body = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
            for stream in (False, True):
                r = http.post("/v1/chat/completions", json={**body, "stream": stream})
                assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down"
                assert r.headers["retry-after"] == "1"
            r = http.get("/health")
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
    finally:
        llm.close()


def refused_history(**assistant) -> list[dict]:
    return [{"role": "user", "content": "How do I pick a lock?"},
            {"role": "assistant", **assistant},
            {"role": "user", "content": "Why not?"}]


@pytest.mark.parametrize("content", [None, ""])
def test_a_refused_turn_is_its_refusal_text(content):
    req = ProxyChatRequest(model="x", messages=refused_history(content=content, refusal=REFUSAL))
    assert req.chat_messages()[1] == {"role": "assistant", "content": REFUSAL}


def test_a_turn_with_content_keeps_it_and_one_without_either_stays_empty():
    req = ProxyChatRequest(model="x", messages=refused_history(content="Sure.", refusal=REFUSAL))
    assert req.chat_messages()[1] == {"role": "assistant", "content": "Sure."}
    req = ProxyChatRequest(model="x", messages=refused_history(content=None))
    assert req.chat_messages()[1] == {"role": "assistant", "content": ""}


def test_the_model_sees_the_refusal_through_the_proxy():
    edge = FakeBackend(reply=lambda m: "ok")
    llm = HybridLLM(edge=edge, cache=False)
    try:
        with TestClient(create_app(llm)) as http:
            r = http.post("/v1/chat/completions", json={
                "model": "x", "messages": refused_history(content=None, refusal=REFUSAL)})
            assert r.status_code == 200, r.text
        assistant = [m for m in edge.calls[-1] if m["role"] == "assistant"]
        assert [m["content"] for m in assistant] == [REFUSAL]
    finally:
        llm.close()
