"""`hybridllm serve` with no cloud and a device model that calls no tools (review 40, fakes).

An agent (LangChain, the OpenAI Agents SDK) sends its ``tools`` on every turn and asks for a plain
text answer with ``tool_choice: "none"``; the library answers that on the device (no model is shown
the tools: ``Request.calls_tools``). Before, the proxy refused every request holding ``tools`` on
such a server with a 400 "tools need a model whose chat template lists them", so the agent's final
turn failed where the library's own ``chat(..., tool_choice="none")`` answered.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "what is the weather in Paris"}]


@pytest.fixture
def http():
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "a text answer"), cache=False)
    try:
        with TestClient(create_app(llm)) as client:
            yield client
    finally:
        llm.close()


@pytest.mark.parametrize("stream", [False, True])
def test_tools_with_tool_choice_none_are_answered_on_the_device(http, stream):
    body = {"model": "x", "messages": ASK, "tools": [WEATHER], "tool_choice": "none", "stream": stream}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.headers["x-hybridllm-route"] == "edge"
    assert _text(r, stream) == "a text answer"


def _text(r, stream: bool) -> str:
    if not stream:
        return r.json()["choices"][0]["message"]["content"]
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])


@pytest.mark.parametrize(
    "extra",
    [
        {},  # tool_choice left out: "auto", the answer may call them
        {"tool_choice": "required"},
        {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    ],
)
def test_tools_the_answer_may_call_are_still_a_400_naming_the_cloud_setting(http, extra):
    r = http.post("/v1/chat/completions", json={"model": "x", "messages": ASK, "tools": [WEATHER], **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools" and "--cloud-url" in error["message"], error


def test_a_conversation_with_tool_turns_still_needs_a_model_that_reads_them(http):
    # with tool_choice "none" too: only a template with a tool format writes calls and results out
    turns = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    body = {"model": "x", "messages": turns, "tools": [WEATHER], "tool_choice": "none"}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert "--cloud-url" in r.json()["error"]["message"]


def test_route_edge_with_tools_names_the_http_field_not_the_librarys_keyword():
    # with a cloud: the library's refusal said "route='edge' cannot take tools ... Leave out route",
    # a keyword no HTTP client has, with param null
    llm = HybridLLM(edge=FakeBackend(), cloud=FakeBackend(model="cloud-model"), cache=False)
    try:
        with TestClient(create_app(llm)) as client:
            body = {"model": "x", "messages": ASK, "tools": [WEATHER], "hybridllm": {"route": "edge"}}
            r = client.post("/v1/chat/completions", json=body)
            # tool_choice "none": a text answer, which the device gives
            ok = client.post("/v1/chat/completions", json={**body, "tool_choice": "none"})
    finally:
        llm.close()
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "hybridllm.route" and "hybridllm.route" in error["message"], error
    assert ok.status_code == 200 and ok.headers["x-hybridllm-route"] == "edge", ok.text
