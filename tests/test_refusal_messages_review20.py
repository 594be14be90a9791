"""A refused answer echoed back in a conversation is read as its words everywhere: by the library's
``normalize_messages``, by the shared wire model (the cloud server) and by the proxy, which now
agree (review 20).

- An assistant turn with ``content`` null or empty and a ``refusal`` (the openai client's
  ``message.model_dump()`` of a refused answer) is its refusal text (the library and the cloud
  server read it as an empty turn; only the proxy had its own override).
- OpenAI's assistant content part ``{"type": "refusal", "refusal": "..."}`` is read as text (both
  servers answered 400 "content parts of type 'refusal' are not supported", the library raised).
"""

from __future__ import annotations

import pytest

from hybridllm import HybridLLM, InvalidRequestError
from hybridllm._types import normalize_messages
from hybridllm.backends.fake import FakeBackend
from hybridllm.wire import WireError
from hybridllm.wire.requests import ChatCompletionRequest, parse_request

REFUSAL = "I can't help with that."


def history(**assistant) -> list[dict]:
    return [{"role": "user", "content": "How do I pick a lock?"},
            {"role": "assistant", **assistant},
            {"role": "user", "content": "Why not?"}]


def wire(messages: list[dict]) -> list[dict]:
    """The messages as the cloud server reads them (the shared wire model)."""
    return parse_request(ChatCompletionRequest, {"model": "m", "messages": messages}).chat_messages()


@pytest.mark.parametrize("content", [None, "", [{"type": "text", "text": ""}]],
                         ids=["null", "empty", "empty-part"])
def test_a_refused_turn_is_its_refusal_text(content):
    messages = history(content=content, refusal=REFUSAL)
    assert normalize_messages(messages)[1] == {"role": "assistant", "content": REFUSAL}
    assert wire(messages)[1] == {"role": "assistant", "content": REFUSAL}


def test_content_wins_over_a_refusal_and_a_turn_with_neither_stays_empty():
    for read in (normalize_messages, wire):
        assert read(history(content="Sure.", refusal=REFUSAL))[1]["content"] == "Sure."
        assert read(history(content=None))[1]["content"] == ""
        assert read(history(content=None, refusal=None))[1]["content"] == ""


def test_a_refusal_part_is_text():
    parts = [{"type": "refusal", "refusal": REFUSAL}, {"type": "text", "text": "Ask a locksmith."}]
    said = f"{REFUSAL}\nAsk a locksmith."
    assert normalize_messages(history(content=parts))[1]["content"] == said
    assert wire(history(content=parts))[1]["content"] == said


def test_the_library_refuses_a_refusal_that_is_not_text():
    with pytest.raises(InvalidRequestError, match=r"messages\[1\]\['refusal'\] must be a string"):
        normalize_messages(history(content=None, refusal=5))
    with pytest.raises(InvalidRequestError, match=r"messages\[1\]\['content'\]\[0\]\['refusal'\]"):
        normalize_messages(history(content=[{"type": "refusal", "refusal": None}]))


def test_the_wire_refuses_a_bad_refusal_part_by_name():
    with pytest.raises(WireError) as info:
        wire(history(content=[{"type": "refusal", "refusal": 5}]))
    assert info.value.param == "messages[1].content" and "refusal" in str(info.value)
    with pytest.raises(WireError) as info:  # an unknown key is named, as in a text part
        wire(history(content=[{"type": "refusal", "refusal": "no", "extra": 1}]))
    assert info.value.param == "messages[1].content[0].extra"


def test_a_refusal_part_stays_refused_outside_an_assistant_turn():
    # as OpenAI: only an assistant's content may hold a refusal part
    part = [{"type": "refusal", "refusal": REFUSAL}]
    with pytest.raises(WireError, match="'refusal' are not supported"):
        wire([{"role": "user", "content": part}])
    with pytest.raises(InvalidRequestError, match="only 'text' parts"):
        normalize_messages([{"role": "user", "content": part}])


def test_the_schema_lists_the_refusal_part():
    schema = ChatCompletionRequest.model_json_schema()
    content = schema["$defs"]["ChatMessage"]["properties"]["content"]
    array = next(m for m in content["anyOf"] if m.get("type") == "array")
    kinds = [item.get("properties", {}).get("type", {}).get("const") for item in array["items"]["anyOf"]]
    assert "refusal" in kinds


def test_chat_shows_the_model_the_refusal():
    edge = FakeBackend(reply=lambda m: "ok")
    llm = HybridLLM(edge=edge, cache=False)
    try:
        llm.chat(history(content=None, refusal=REFUSAL))
        llm.chat(history(content=[{"type": "refusal", "refusal": REFUSAL}]))
    finally:
        llm.close()
    assert [[m["content"] for m in call if m["role"] == "assistant"] for call in edge.calls] \
        == [[REFUSAL], [REFUSAL]]


def test_the_proxy_takes_a_refusal_part():
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    edge = FakeBackend(reply=lambda m: "ok")
    llm = HybridLLM(edge=edge, cache=False)
    try:
        with TestClient(create_app(llm)) as http:
            r = http.post("/v1/chat/completions", json={
                "model": "x", "messages": history(content=[{"type": "refusal", "refusal": REFUSAL}])})
            assert r.status_code == 200, r.text  # before: 400
        assert [m["content"] for m in edge.calls[-1] if m["role"] == "assistant"] == [REFUSAL]
    finally:
        llm.close()
