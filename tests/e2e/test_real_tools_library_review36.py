"""Function calling through the library and ``hybridllm serve`` on real models (review 36): the
device is SmolLM2-135M on llama.cpp, the cloud ``hybridllm-cloud`` on Qwen2.5-Coder-0.5B (whose
template lists the tools). A request with tools goes to the cloud unscored (SmolLM2's template has
no tools), and its call comes back in ``Completion.tool_calls`` and, through the proxy, to the
official client, streamed and not. With Qwen2.5-Coder-0.5B as the device model, the device calls
the tools itself.

Review 37: an auto call is held to its tool's schema. Asked for an alarm at "25:00", Qwen2.5-Coder-0.5B
writes ``{"hour": 25, "minute": 00}`` unheld (``00`` is no JSON number: the answer was text, no
call); held, the call is valid JSON inside the tool's bounds, on the device (llama.cpp) and on the
cloud engine (through the official client), and small talk with the same tool is still text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from hybridllm import HybridLLM
from tests.cloud_server.api.helpers import free_port, served_smollm2
from tests.cloud_server.api.test_real_tools_review35 import ADD, WEATHER  # the same two tools

from .conftest import running_proxy

pytestmark = pytest.mark.real
openai = pytest.importorskip("openai")

ASK = "What's the weather like in Paris today?"


@pytest.fixture(scope="module")
def qwen_cloud() -> Iterator[str]:
    from hybridllm.models import pull

    with served_smollm2(pull("qwen2.5-coder-0.5b-instruct"), "qwen", "--max-model-len", "2048") as base:
        yield f"{base}/v1"


@pytest.fixture(scope="module")
def proxy(qwen_cloud: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_proxy(qwen_cloud, tmp_path_factory.mktemp("proxy")) as url:
        yield url


def test_the_library_gets_the_cloud_models_call_and_sends_its_result_back(qwen_cloud: str) -> None:
    with HybridLLM(cloud_url=qwen_cloud, cache=False) as llm:
        c = llm.chat(ASK, tools=[WEATHER], temperature=0, max_tokens=80)
        assert c.route == "cloud" and c.reason.startswith("tools"), (c.route, c.reason)
        assert c.finish_reason == "tool_calls" and c.model == "qwen"
        (call,) = c.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"
        # the result goes back with the call; "none": the cloud model answers in text
        turns = [
            {"role": "user", "content": ASK},
            c.message(),
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 18, "sky": "cloudy"}'},
        ]
        answer = llm.chat(turns, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=60)
        assert answer.route == "cloud" and answer.tool_calls == [] and answer.text
        assert "18" in answer.text  # the result reached the model (the 0.5B quotes it)
        # streamed, the call comes in pieces that add up to the whole one
        with llm.stream(ASK, tools=[WEATHER], temperature=0, max_tokens=80) as s:
            pieces = [d for chunk in s for d in chunk.tool_calls]
        assert pieces[0].name == "get_weather"
        assert "".join(p.arguments for p in pieces) == s.completion.tool_calls[0].function.arguments


def test_hybridllm_serve_answers_the_official_clients_tools(proxy: str) -> None:
    client = openai.OpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0, timeout=300)
    messages = [{"role": "user", "content": ASK}]
    raw = client.chat.completions.with_raw_response.create(
        model="hybridllm", messages=messages, tools=[WEATHER], temperature=0, max_tokens=80
    )
    r = raw.parse()
    assert raw.headers["x-hybridllm-route"] == "cloud"
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert json.loads(choice.message.tool_calls[0].function.arguments)["city"] == "Paris"
    stream = client.chat.completions.create(
        model="hybridllm", messages=messages, tools=[WEATHER], temperature=0, max_tokens=80, stream=True
    )
    name, args, finish = "", "", None
    for chunk in stream:
        for c in chunk.choices:
            finish = c.finish_reason or finish
            for d in c.delta.tool_calls or []:
                name += d.function.name or ""
                args += d.function.arguments or ""
    assert finish == "tool_calls" and name == "get_weather" and json.loads(args)["city"] == "Paris"


def test_a_device_model_whose_template_lists_tools_calls_them_on_the_device() -> None:
    """Qwen2.5-Coder-0.5B as the device model (llama.cpp): no cloud at all, and a dead one."""

    with HybridLLM(edge_model="qwen2.5-coder-0.5b-instruct", cache=False) as llm:
        c = llm.chat(ASK, tools=[WEATHER, ADD], temperature=0, max_tokens=80)
        assert c.route == "edge" and c.finish_reason == "tool_calls", (c.route, c.text)
        assert [t.function.name for t in c.tool_calls] == ["get_weather"]
        assert json.loads(c.tool_calls[0].function.arguments)["city"] == "Paris"
        # a named function: the grammar holds the arguments to its schema, streamed as written
        named = {"type": "function", "function": {"name": "add"}}
        with llm.stream("What is 23 + 7?", tools=[WEATHER, ADD], tool_choice=named, temperature=0) as s:
            pieces = [d for chunk in s for d in chunk.tool_calls]
        assert pieces[0].name == "add" and len(pieces) > 2
        assert json.loads("".join(p.arguments for p in pieces)) == {"a": 23, "b": 7}
        assert s.completion.finish_reason == "stop"  # a named function's answer, as OpenAI's
        # a question that needs no tool is answered in text
        haiku = llm.chat("Write a haiku about the sea.", tools=[WEATHER, ADD], temperature=0, max_tokens=40)
        assert haiku.tool_calls == [] and haiku.text.strip()
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with HybridLLM(
        edge_model="qwen2.5-coder-0.5b-instruct", cloud_url=dead, cache=False, cloud_max_retries=0
    ) as llm:
        c = llm.chat(ASK, tools=[WEATHER], temperature=0, max_tokens=80, route="cloud")
        assert c.route == "edge (cloud unavailable)" and c.tool_calls[0].function.name == "get_weather"


# ---- review 37: an auto call held to its tool's schema ----------------------------------------

ALARM = {
    "type": "function",
    "function": {
        "name": "set_alarm",
        "description": "Set an alarm",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["hour", "minute"],
            "properties": {
                "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                "minute": {"type": "integer", "minimum": 0, "maximum": 59},
            },
        },
    },
}
PAST_MIDNIGHT = "Set an alarm at 25:00"


def _in_bounds(arguments: str) -> bool:
    args = json.loads(arguments)
    return (
        set(args) == {"hour", "minute"}
        and all(isinstance(v, int) for v in args.values())
        and 0 <= args["hour"] <= 23
        and 0 <= args["minute"] <= 59
    )


def test_the_devices_auto_call_is_held_to_the_tools_schema_review37() -> None:
    with HybridLLM(edge_model="qwen2.5-coder-0.5b-instruct", cache=False) as llm:
        c = llm.chat(PAST_MIDNIGHT, tools=[ALARM], temperature=0, max_tokens=80)
        assert c.route == "edge" and c.finish_reason == "tool_calls", (c.route, c.text)
        (call,) = c.tool_calls
        assert call.function.name == "set_alarm" and _in_bounds(call.function.arguments), call
        # streamed, the bare call (as this model writes it) comes in pieces as it is written:
        # its name first, then its arguments (before: one whole piece at the end)
        with llm.stream(PAST_MIDNIGHT, tools=[ALARM], temperature=0, max_tokens=80) as s:
            pieces = [d for chunk in s for d in chunk.tool_calls]
        assert pieces[0].name == "set_alarm" and len(pieces) > 2, pieces
        assert "".join(p.arguments for p in pieces) == s.completion.tool_calls[0].function.arguments
        # no call asked for: the text is the model's own, not bent into a call
        hello = llm.chat("Say hello in French.", tools=[ALARM], temperature=0, max_tokens=30)
        assert hello.tool_calls == [] and hello.text.strip()


def test_the_cloud_engines_auto_call_is_held_to_the_tools_schema_review37(qwen_cloud: str) -> None:
    client = openai.OpenAI(base_url=qwen_cloud, api_key="unused", max_retries=0, timeout=300)
    messages: Any = [{"role": "user", "content": PAST_MIDNIGHT}]
    r = client.chat.completions.create(
        model="qwen", messages=messages, tools=[ALARM], temperature=0, max_tokens=80
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    assert _in_bounds(choice.message.tool_calls[0].function.arguments)
    stream = client.chat.completions.create(
        model="qwen", messages=messages, tools=[ALARM], temperature=0, max_tokens=80, stream=True
    )
    args, finish = "", None
    for chunk in stream:
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                args += d.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and _in_bounds(args)
