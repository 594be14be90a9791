"""``tool_choice="none"`` asks for a text answer: the tools are not in the prompt, so a device model
without a tool format in its template can give it. Before, such a request was treated as one that
calls tools: sent to the cloud whatever the router said, refused with ``route="edge"``, and a
``ConfigError`` on a client without a cloud."""

from __future__ import annotations

import asyncio

import pytest

from hybridllm import AsyncHybridLLM, ConfigError, HybridLLM, InvalidRequestError
from hybridllm.backends.fake import FakeBackend
from hybridllm.router import RoutingPolicy

from .test_context_window import EdgeRouter
from .test_pii_restore import HardRouter

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
ASK = "Say hi."


def _device() -> FakeBackend:
    return FakeBackend(model="edge-model", reply=lambda m: "device answer")  # no calls_tools: no tool format


def _cloud() -> FakeBackend:
    return FakeBackend(model="cloud-model", reply=lambda m: "cloud answer")


def test_a_device_only_client_answers_tool_choice_none():
    with HybridLLM(edge=_device(), cache=False) as llm:
        done = llm.chat(ASK, tools=[WEATHER], tool_choice="none")
        assert (done.route, done.text, done.tool_calls) == ("edge", "device answer", [])
        with pytest.raises(ConfigError, match="cloud_url"):  # a call it may make still needs a model for it
            llm.chat(ASK, tools=[WEATHER])


def test_route_edge_takes_tool_choice_none():
    with HybridLLM(edge=_device(), cloud=_cloud(), policy=EdgeRouter(), cache=False) as llm:
        assert llm.chat(ASK, tools=[WEATHER], tool_choice="none", route="edge").text == "device answer"
        with pytest.raises(InvalidRequestError, match="route='edge' cannot take tools"):
            llm.chat(ASK, tools=[WEATHER], tool_choice="auto", route="edge")


def test_the_router_places_tool_choice_none_as_any_question():
    with HybridLLM(edge=_device(), cloud=_cloud(), policy=EdgeRouter(), cache=False) as llm:
        kept = llm.chat(ASK, tools=[WEATHER], tool_choice="none")
        assert (kept.route, kept.text) == ("edge", "device answer")
        sent = llm.chat(ASK, tools=[WEATHER])  # calls it may make: only the cloud model calls them
        assert (sent.route, sent.text) == ("cloud", "cloud answer")
        assert sent.reason.startswith("tools:")
    policy = RoutingPolicy(HardRouter(), privacy="off")
    with HybridLLM(edge=_device(), cloud=_cloud(), policy=policy, cache=False) as llm:
        assert llm.chat(ASK, tools=[WEATHER], tool_choice="none").route == "cloud"  # scored hard


def test_the_async_client_and_a_stream_take_it_too():
    async def main() -> list[str]:
        async with AsyncHybridLLM(edge=_device(), cache=False) as llm:
            done = await llm.chat(ASK, tools=[WEATHER], tool_choice="none")
            async with llm.stream(ASK, tools=[WEATHER], tool_choice="none") as s:
                text = "".join([c.text async for c in s])
            return [done.text, text]

    assert asyncio.run(main()) == ["device answer", "device answer"]


def test_a_conversation_with_calls_still_needs_a_model_that_reads_them():
    """The turn after a call: its call and result are written out only by a template with a tool
    format, so with tool_choice "none" too it goes to the cloud (the real 1.5B case in
    ``tests/e2e/test_real_tools_library_review36.py``)."""
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    turns = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp_c": 18}'},
    ]
    with HybridLLM(edge=_device(), cloud=_cloud(), policy=EdgeRouter(), cache=False) as llm:
        done = llm.chat(turns, tools=[WEATHER], tool_choice="none")
        assert (done.route, done.text) == ("cloud", "cloud answer")
    with HybridLLM(edge=_device(), cache=False) as llm, pytest.raises(ConfigError, match="cloud_url"):
        llm.chat(turns, tools=[WEATHER], tool_choice="none")
