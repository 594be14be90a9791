"""An auto answer's tool call held to its tool's schema on real models (review 37). Asked for an
alarm at "25:00", Qwen2.5-Coder-0.5B writes ``{"hour": 25, "minute": 00}`` unheld: ``00`` is no
JSON number, so the answer was read as text and the app got no call. Held, the call is valid
JSON inside the tool's bounds, on the device (llama.cpp) and on the cloud engine (through the
official client), and small talk with the same tools is still text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from hybridllm import HybridLLM
from tests.cloud_server.api.helpers import served_smollm2

pytestmark = pytest.mark.real
openai = pytest.importorskip("openai")

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
ASK = "Set an alarm at 25:00"


def _in_bounds(arguments: str) -> bool:
    args = json.loads(arguments)
    return (
        set(args) == {"hour", "minute"}
        and all(isinstance(v, int) for v in args.values())
        and 0 <= args["hour"] <= 23
        and 0 <= args["minute"] <= 59
    )


@pytest.fixture(scope="module")
def qwen_device() -> Iterator[Any]:
    from hybridllm.backends.llama_cpp import LlamaCppBackend
    from hybridllm.models import resolve_gguf

    _, path, _ = resolve_gguf("qwen2.5-coder-0.5b-instruct")
    edge = LlamaCppBackend(str(path), n_ctx=2048, n_threads=2)
    yield edge
    edge.close()


def test_the_device_call_is_held_to_the_tools_schema(qwen_device: Any) -> None:
    with HybridLLM(edge=qwen_device, cache=False) as llm:
        c = llm.chat(ASK, tools=[ALARM], temperature=0, max_tokens=80)
        assert c.route == "edge" and c.finish_reason == "tool_calls", (c.route, c.text)
        (call,) = c.tool_calls
        assert call.function.name == "set_alarm" and _in_bounds(call.function.arguments), call
        # no call asked for: the text is the model's own, not bent into a call
        hello = llm.chat("Say hello in French.", tools=[ALARM], temperature=0, max_tokens=30)
        assert hello.tool_calls == [] and hello.text.strip()


@pytest.fixture(scope="module")
def qwen_cloud() -> Iterator[str]:
    from hybridllm.models import pull

    with served_smollm2(pull("qwen2.5-coder-0.5b-instruct"), "qwen", "--max-model-len", "2048") as base:
        yield f"{base}/v1"


def test_the_cloud_engines_call_is_held_to_the_tools_schema(qwen_cloud: str) -> None:
    client = openai.OpenAI(base_url=qwen_cloud, api_key="unused", max_retries=0, timeout=300)
    messages: Any = [{"role": "user", "content": ASK}]
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
