"""`hybridllm serve` refuses empty turns as the library refuses ``chat("")``, naming the message.

Before: ``{"role": "user", "content": ""}`` and ``"content": []`` (an empty list of parts, which
OpenAI refuses: "empty array") were 200s: the device answered a prompt with no question in it,
while ``HybridLLM.chat("")`` is an ``InvalidRequestError`` ("The prompt is empty"). Now both are
400s whose ``param`` is ``messages[i].content``; an empty system or assistant turn stays accepted.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM, InvalidRequestError  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

HI = {"role": "user", "content": "hi"}


@pytest.fixture
def served():
    edge = FakeBackend(reply=lambda m: "device answer")
    llm = HybridLLM(edge=edge, cache=False)
    with TestClient(create_app(llm)) as http:
        yield http, edge
    llm.close()


@pytest.mark.parametrize(("messages", "index"), [
    ([{"role": "user", "content": ""}], 0),
    ([{"role": "user", "content": " \n\t"}], 0),
    ([{"role": "user", "content": []}], 0),
    ([{"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": " "}]}], 0),
    ([{"role": "system", "content": "be brief"}, HI, {"role": "assistant", "content": "hello"},
      {"role": "user", "content": ""}], 3),
    ([{"role": "system", "content": []}, HI], 0),
    ([HI, {"role": "assistant", "content": []}, HI], 1),
])
def test_an_empty_turn_is_a_400_naming_the_message(served, messages, index):
    http, edge = served
    for stream in (False, True):
        r = http.post("/v1/chat/completions", json={"model": "x", "messages": messages, "stream": stream})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == f"messages[{index}].content", error
        assert error["type"] == "invalid_request_error" and f"messages[{index}]" in error["message"]
    assert edge.calls == []


@pytest.mark.parametrize("messages", [
    [{"role": "system", "content": ""}, HI],
    [HI, {"role": "assistant", "content": ""}, HI],
    # (a whole call: since review 36 a call's function is read, and one without it is a 400 naming it)
    [HI, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, HI],
    [{"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "hi"}]}],
])
def test_turns_with_text_where_it_is_needed_are_answered(served, messages):
    http, edge = served
    r = http.post("/v1/chat/completions", json={"model": "x", "messages": messages})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "device answer"


def test_the_library_refuses_the_empty_prompt_too():
    llm = HybridLLM(edge=FakeBackend(), cache=False)
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.chat("")
    llm.close()


def test_the_document_says_so(served):
    """A generated client or a fuzzer reads the rule from the schema."""
    http, _ = served
    doc = http.get("/openapi.json").json()
    ref = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    schema = doc["components"]["schemas"][ref["schema"]["$ref"].rsplit("/", 1)[1]]
    rule = schema["properties"]["messages"]["items"]["allOf"][1]
    assert rule["properties"]["content"] == {"not": {"type": "array", "maxItems": 0}}
    assert rule["if"]["properties"]["role"] == {"const": "user"}


def test_the_openai_client_gets_a_bad_request_on_a_real_socket():
    openai = pytest.importorskip("openai")
    from tests.cloud_server.api.helpers import ThreadServer

    edge = FakeBackend(reply=lambda m: "device answer")
    llm = HybridLLM(edge=edge, cache=False)
    server = ThreadServer(create_app(llm)).start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=10)
        with pytest.raises(openai.BadRequestError) as empty_parts:
            client.chat.completions.create(model="x", messages=[HI, {"role": "user", "content": []}])
        with pytest.raises(openai.BadRequestError) as empty_text:
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": ""}])
        ok = client.chat.completions.create(model="x", messages=[HI])
    finally:
        server.stop()
        llm.close()
    assert empty_parts.value.param == "messages[1].content"
    assert empty_text.value.param == "messages[0].content"
    assert ok.choices[0].message.content == "device answer" and len(edge.calls) == 1
