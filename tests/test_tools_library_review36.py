"""Function calling through the library and ``hybridllm serve`` (review 36): ``chat(..., tools=...)``
goes to the cloud model (the only one that calls tools), over real HTTP to the real cloud server
app (its engine a fake that writes a call), and comes back as ``Completion.tool_calls`` (streamed:
``Chunk.tool_calls``); the next turn carries the call and its result to the cloud; such requests
never touch the semantic cache; a dead cloud is an error, never a device answer; privacy="redact"
sends placeholders in earlier calls' arguments and restores them in the answer's. The proxy takes
``tools`` from the official client and answers its calls, streamed and not. Before, ``tools`` was
"Unknown option" in the library and a 400 in the proxy. The real models are in
``tests/e2e/test_real_tools_library_review36.py``."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from cloud_server.api.server import create_app as create_cloud_app
from hybridllm import (
    AsyncHybridLLM,
    CloudUnavailableError,
    ConfigError,
    HybridLLM,
    InvalidRequestError,
    ToolCall,
    ToolCallDelta,
)
from hybridllm.backends.fake import FakeBackend
from hybridllm.proxy import create_app as create_proxy_app
from hybridllm.router import RoutingPolicy
from tests._open_clients import close_clients_left_open  # noqa: F401 - an autouse fixture
from tests._uvicorn_thread import serving
from tests.cloud_server.api.fake_engine import CharTokenizer, FakeEngine

from .test_pii_restore import HardRouter

openai = pytest.importorskip("openai")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "to": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ASK = "What's the weather in Paris?"
HARD = RoutingPolicy(HardRouter(), privacy="off")  # every question to the cloud (no learned router to load)


class SeeingTokenizer(CharTokenizer):
    """Keeps what the cloud's chat template was given: the messages and the tools."""

    seen: list[tuple[list[dict[str, Any]], Any]] = []

    def encode_chat(  # type: ignore[override]
        self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True, tools: Any = None
    ) -> list[int]:
        type(self).seen.append((messages, tools))
        return self.encode(self.apply_chat_template(messages) + json.dumps(tools or []))


class Cache:
    """A cache port that records every use: a request with tools must make none."""

    def __init__(self) -> None:
        self.gets: list[Any] = []
        self.puts: list[Any] = []

    def get(self, messages: Any, **kw: Any) -> None:
        self.gets.append(messages)

    def put(self, messages: Any, text: str, **kw: Any) -> None:
        self.puts.append((messages, text))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(app: Any) -> tuple[Any, str]:
    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    return uvicorn.Server(config), f"http://127.0.0.1:{port}"


def _cloud_serving(reply: str) -> Any:
    def factory() -> FakeEngine:
        engine = FakeEngine(step_s=0.0, reply=reply, max_model_len=8192)
        engine.tokenizer = SeeingTokenizer()
        return engine

    return _serve(create_cloud_app(factory))


@pytest.fixture()
def cloud_url() -> Iterator[str]:
    SeeingTokenizer.seen = []
    server, base = _cloud_serving(CALL)
    with serving(server, start_s=30):
        yield f"{base}/v1"


@pytest.fixture()
def llm(cloud_url: str) -> Iterator[tuple[HybridLLM, FakeBackend, Cache]]:
    edge, cache = FakeBackend(), Cache()
    client = HybridLLM(edge=edge, cloud_url=cloud_url, cache=cache, cloud_max_retries=0, policy=HARD)
    with client:
        yield client, edge, cache


def test_a_call_comes_back_whole_goes_on_in_the_next_turn_and_never_touches_the_cache(llm) -> None:
    client, edge, cache = llm
    c = client.chat(ASK, tools=[WEATHER], max_tokens=200)
    assert c.route == "cloud" and "tools" in c.reason, c.reason
    assert c.finish_reason == "tool_calls" and c.text == ""
    (call,) = c.tool_calls
    assert isinstance(call, ToolCall) and call.id.startswith("call_")
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    messages, tools = SeeingTokenizer.seen[-1]
    assert tools == [WEATHER] and messages == [{"role": "user", "content": ASK}]
    assert edge.calls == []  # the device wrote nothing
    # the next turn: the answer's message, then the tool's result tied to its call
    turn = c.message()
    assert turn == {"role": "assistant", "content": None, "tool_calls": [call.to_dict()]}
    result = {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 18}'}
    c2 = client.chat([{"role": "user", "content": ASK}, turn, result], tools=[WEATHER], tool_choice="none")
    assert c2.text == CALL and c2.tool_calls == [] and c2.finish_reason == "stop"
    messages, tools = SeeingTokenizer.seen[-1]
    assert tools is None  # tool_choice none: the cloud's template is not shown the tools
    assert messages[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert messages[2]["tool_call_id"] == call.id and messages[2]["content"] == '{"temp_c": 18}'
    assert cache.gets == [] and cache.puts == []
    # a conversation with a tool's result keeps out of the cache without tools too
    client.chat([{"role": "user", "content": ASK}, turn, result], route="cloud")
    assert cache.gets == [] and cache.puts == []
    client.chat("hello")  # a plain question still uses it
    assert len(cache.gets) == 1


def test_streamed_calls_come_as_deltas_sync_and_async(llm) -> None:
    client, _, _ = llm
    with client.stream(ASK, tools=[WEATHER], max_tokens=200) as s:
        chunks = list(s)
    pieces = [d for ch in chunks for d in ch.tool_calls]
    assert pieces and all(isinstance(d, ToolCallDelta) for d in pieces)
    assert pieces[0].name == "get_weather" and pieces[0].id is not None
    assert json.loads("".join(d.arguments for d in pieces)) == {"city": "Paris"}
    assert not "".join(ch.text for ch in chunks)
    assert s.completion.tool_calls[0].id == pieces[0].id and s.completion.finish_reason == "tool_calls"
    assert chunks[-1].to_dict()["finish_reason"] == "tool_calls"

    async def run() -> Any:
        async with AsyncHybridLLM.wrap(client).stream(ASK, tools=[WEATHER], max_tokens=200) as a:
            return [d async for ch in a for d in ch.tool_calls], a.completion

    import asyncio

    deltas, completion = asyncio.run(run())
    assert deltas[0].name == "get_weather"
    assert completion.tool_calls[0].function.arguments == "".join(d.arguments for d in deltas)


def test_bad_tools_are_refused_at_the_call_naming_the_field(llm) -> None:
    client, _, _ = llm
    cases = [
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": []}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ]
    for options, param in cases:
        with pytest.raises(InvalidRequestError) as err:
            client.stream(ASK, **options)
        assert getattr(err.value, "param", None) == param, (options, err.value)
    with pytest.raises(InvalidRequestError, match="response_format"):
        client.chat(ASK, tools=[WEATHER], response_format={"type": "json_object"})
    with pytest.raises(InvalidRequestError, match="route='edge'"):
        client.chat(ASK, tools=[WEATHER], route="edge")
    with pytest.raises(InvalidRequestError, match="tool_calls"):
        client.chat([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"id": "1"}]}])
    with (
        HybridLLM(edge=FakeBackend(), cache=False) as device_only,
        pytest.raises(ConfigError, match="cloud_url"),
    ):
        device_only.chat(ASK, tools=[WEATHER])


def test_a_dead_cloud_is_an_error_that_names_the_tools_never_a_device_answer() -> None:
    edge = FakeBackend()
    url = f"http://127.0.0.1:{_free_port()}/v1"  # nothing listens there
    with HybridLLM(edge=edge, cloud_url=url, cache=False, cloud_max_retries=0, policy=HARD) as client:
        for _ in range(2):  # refused, then with the circuit open
            with pytest.raises(CloudUnavailableError, match="tools"):
                client.chat(ASK, tools=[WEATHER])
        assert client.chat(ASK).route == "edge (cloud unavailable)"  # without tools the device answers
    assert len(edge.calls) == 1


def test_privacy_redact_sends_placeholders_in_earlier_calls_and_restores_the_answers() -> None:
    email = "jane.doe@example.com"
    call = {"name": "get_weather", "arguments": {"city": "Paris", "to": "[EMAIL_1]"}}
    reply = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    SeeingTokenizer.seen = []
    server, base = _cloud_serving(reply)
    earlier = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo", "to": email})},
            }
        ],
    }
    conversation = [
        {"role": "user", "content": "Weather for my trips, please"},
        earlier,
        {"role": "tool", "tool_call_id": "c1", "content": "cold"},
        {"role": "user", "content": "And Paris?"},
    ]
    with serving(server, start_s=30):
        policy = RoutingPolicy(HardRouter(), privacy="redact")
        with HybridLLM(edge=FakeBackend(), cloud_url=f"{base}/v1", policy=policy, cache=False) as client:
            c = client.chat(conversation, tools=[WEATHER], max_tokens=300)
            with client.stream(conversation, tools=[WEATHER], max_tokens=300) as s:
                shown = [d for ch in s for d in ch.tool_calls]
    sent = json.dumps([m for m, _ in SeeingTokenizer.seen])
    assert email not in sent and "[EMAIL_1]" in sent
    assert "email redacted" in c.reason
    assert json.loads(c.tool_calls[0].function.arguments) == {"city": "Paris", "to": email}
    # streamed, the call is held and shown whole, restored: never its placeholder
    assert json.loads("".join(d.arguments for d in shown))["to"] == email
    assert s.completion.tool_calls == c.tool_calls[:0] + s.completion.tool_calls  # (whole, as chat's)
    assert json.loads(s.completion.tool_calls[0].function.arguments)["to"] == email


def test_privacy_keep_on_device_refuses_tools_with_what_to_do(cloud_url: str) -> None:
    policy = RoutingPolicy(HardRouter(), privacy="keep_on_device")
    with HybridLLM(edge=FakeBackend(), cloud_url=cloud_url, policy=policy, cache=False) as client:
        with pytest.raises(InvalidRequestError, match="privacy='redact'"):
            client.chat("Mail jane.doe@example.com the weather", tools=[WEATHER])


# -- hybridllm serve, with the official client ----------------------------------------------------


@pytest.fixture()
def proxy(cloud_url: str) -> Iterator[Any]:
    client = HybridLLM(edge=FakeBackend(), cloud_url=cloud_url, cache=False, cloud_max_retries=0, policy=HARD)
    server, base = _serve(create_proxy_app(client))
    with client, serving(server, start_s=30):
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=60)


def test_the_proxy_answers_calls_to_the_official_client(proxy) -> None:
    messages = [{"role": "user", "content": ASK}]
    r = proxy.chat.completions.create(model="hybridllm", messages=messages, tools=[WEATHER], max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    # streamed: the client's deltas add up to the same call
    stream = proxy.chat.completions.create(
        model="hybridllm", messages=messages, tools=[WEATHER], max_tokens=200, stream=True
    )
    parts: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        for choice_delta in chunk.choices:
            finish = choice_delta.finish_reason or finish
            for d in choice_delta.delta.tool_calls or []:
                got = parts.setdefault(d.index, {"name": "", "arguments": "", "id": ""})
                got["id"] += d.id or ""
                got["name"] += d.function.name or ""
                got["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls" and parts[0]["name"] == "get_weather" and parts[0]["id"]
    assert json.loads(parts[0]["arguments"]) == {"city": "Paris"}
    # the result turn goes back through the proxy (the client's own message object, dumped)
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C"},
    ]
    r = proxy.chat.completions.create(
        model="hybridllm", messages=messages, tools=[WEATHER], tool_choice="none"
    )
    assert r.choices[0].message.content == CALL and not r.choices[0].message.tool_calls
    sent, _ = SeeingTokenizer.seen[-1]
    assert sent[1]["tool_calls"][0]["id"] == call.id and sent[2]["tool_call_id"] == call.id


def test_the_proxy_refuses_bad_tools_with_their_param(proxy) -> None:
    for body, param in [
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}}, "tool_choice"),
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
    ]:
        with pytest.raises(openai.BadRequestError) as err:
            proxy.chat.completions.create(
                model="hybridllm", messages=[{"role": "user", "content": ASK}], **body
            )
        assert err.value.body["param"] == param, err.value.body
    bad_turn = {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]}
    with pytest.raises(openai.BadRequestError) as err:
        proxy.chat.completions.create(
            model="hybridllm", tools=[WEATHER], messages=[{"role": "user", "content": ASK}, bad_turn]
        )
    assert err.value.body["param"] == "messages[1].tool_calls[0]"


def test_a_proxy_without_a_cloud_says_tools_need_one() -> None:
    client = HybridLLM(edge=FakeBackend(), cache=False)
    server, base = _serve(create_proxy_app(client))
    with client, serving(server, start_s=30):
        api = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError) as err:
            api.chat.completions.create(
                model="hybridllm", messages=[{"role": "user", "content": ASK}], tools=[WEATHER]
            )
    assert err.value.body["param"] == "tools" and "--cloud-url" in err.value.body["message"]


# -- the pieces: the reader of a cloud's calls, a whole (non-streamed) answer, a broken stream -----


def test_the_calls_reader_joins_pieces_and_refuses_malformed_ones() -> None:
    from hybridllm._tools import CallsReader

    reader = CallsReader()
    first = reader.feed(
        [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}]
    )
    assert first == [ToolCallDelta(0, "c1", "f", "")]
    # a server that repeats the id and name in every piece: passed on once
    assert reader.feed([{"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}}]) == [
        ToolCallDelta(0, None, None, '{"a"')
    ]
    reader.feed(
        [{"index": 0, "function": {"arguments": ": 1}"}}, {"index": 1, "id": "c2", "function": {"name": "g"}}]
    )
    calls = reader.calls()
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("c1", "f", '{"a": 1}'),
        ("c2", "g", ""),
    ]
    for bad in ({"index": -1}, {"index": True}, {"index": 0, "function": {"arguments": 5}}, "x"):
        with pytest.raises(ValueError):
            CallsReader().feed([bad])
    nameless = CallsReader()
    nameless.feed([{"index": 0, "function": {"arguments": "{}"}}])
    with pytest.raises(ValueError, match="no function name"):
        nameless.calls()


def test_a_whole_json_answer_with_calls_is_read_as_a_streamed_one() -> None:
    from hybridllm.backends.cloud_stream import _read_completion

    class Resp:
        text = ""

        def json(self) -> dict:
            return {
                "model": "m",
                "choices": [
                    {
                        "finish_reason": "tool_calls",
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "c1",
                                    "type": "function",
                                    "function": {"name": "f", "arguments": "{}"},
                                },
                                {
                                    "id": "c2",
                                    "type": "function",
                                    "function": {"name": "g", "arguments": "[]"},
                                },
                            ],
                        },
                    }
                ],
            }

    whole, final = _read_completion(Resp(), "http://x")
    assert whole.text == "" and final.finish_reason == "tool_calls"
    assert [(d.index, d.id, d.name, d.arguments) for d in whole.tool_calls] == [
        (0, "c1", "f", "{}"),
        (1, "c2", "g", "[]"),
    ]


class BreakingCloud(FakeBackend):
    """Streams a call's first piece (or some text), then its connection breaks."""

    def __init__(self, text: str = "") -> None:
        super().__init__(model="cloud-model")
        self.text = text

    def stream(self, messages: Any, params: Any) -> Iterator[Any]:
        from hybridllm.backends.base import Delta

        self.calls.append(messages)
        if self.text:
            yield Delta(self.text)
        else:
            yield Delta("", tool_calls=[ToolCallDelta(0, "c1", "get_weather", '{"ci')])
        raise CloudUnavailableError("connection reset")


@pytest.mark.parametrize("text", ["", "Let me check"])
def test_a_cloud_stream_that_breaks_is_an_error_the_device_never_finishes(text: str) -> None:
    edge = FakeBackend()
    with HybridLLM(edge=edge, cloud=BreakingCloud(text), policy=HARD, cache=False) as client:
        with pytest.raises(CloudUnavailableError, match="tools"):
            client.chat(ASK, tools=[WEATHER])
        assert edge.calls == [] and edge.continued == []  # the device wrote nothing
        # without tools the device finishes the text (or answers) as it always did
        expected = "cloud->edge" if text else "edge (cloud unavailable)"
        assert client.chat(ASK).route == expected
    assert len(edge.calls) == 1


def test_tools_skip_the_router_and_are_held_to_the_budget(cloud_url: str) -> None:
    from hybridllm import CloudBudgetSpentError

    with HybridLLM(
        edge=FakeBackend(), cloud_url=cloud_url, policy=HARD, cache=False, max_cloud_calls_per_hour=1
    ) as client:
        c = client.chat(ASK, tools=[WEATHER], max_tokens=200)
        assert c.score is None and c.reason == "tools: only the cloud model calls them"  # not scored
        with pytest.raises(CloudBudgetSpentError, match="without tools for the device"):
            client.chat(ASK, tools=[WEATHER])
        assert client.chat(ASK).route == "edge"  # without tools the device stands in, as before
        assert client.stats()["budget"]["calls_hour"] == 1


# -- a device model that reads tools (its template lists them: Qwen2.5's) ------------------------


class ToolDevice(FakeBackend):
    """A device model whose template lists tools: it writes ``reply`` and keeps the params it got."""

    def __init__(self, reply: str = CALL) -> None:
        super().__init__(model="tool-device", reply=lambda messages: reply)
        self.params: list[Any] = []

    def calls_tools(self) -> bool:
        return True

    def stream(self, messages: Any, params: Any) -> Iterator[Any]:
        self.params.append(params)
        return super().stream(messages, params)


class EasyRouter(HardRouter):
    def score_text(self, text: str, *, embedding: Any = None) -> float:
        return 0.1


def test_a_device_that_reads_tools_answers_them_alone_with_calls_streamed_or_not() -> None:
    edge = ToolDevice()
    with HybridLLM(edge=edge, cache=False) as client:  # no cloud at all
        c = client.chat(ASK, tools=[WEATHER], max_tokens=200)
        assert c.route == "edge" and c.finish_reason == "tool_calls" and c.text == ""
        assert [(t.function.name, json.loads(t.function.arguments)) for t in c.tool_calls] == [
            ("get_weather", {"city": "Paris"})
        ]
        assert edge.params[-1].tools == (WEATHER,)  # the device was given the tools
        with client.stream(ASK, tools=[WEATHER], route="edge") as s:  # sync: read on this thread
            chunks = list(s)
        assert not "".join(ch.text for ch in chunks)  # the call's text is never shown as text
        # a tagged auto call streams: its name first, then its arguments as the device writes them
        pieces = [d for ch in chunks for d in ch.tool_calls]
        assert pieces[0].name == "get_weather" and pieces[0].id == s.completion.tool_calls[0].id
        assert "".join(p.arguments for p in pieces) == s.completion.tool_calls[0].function.arguments

        async def run() -> Any:  # async: the device's own thread
            async with AsyncHybridLLM.wrap(client).stream(ASK, tools=[WEATHER]) as a:
                return [d async for ch in a for d in ch.tool_calls], a.completion

        import asyncio

        deltas, completion = asyncio.run(run())
        assert [d.name for d in deltas if d.name] == [
            "get_weather"
        ] and completion.finish_reason == "tool_calls"
    # an answer that calls nothing is text, as it was written
    with HybridLLM(edge=ToolDevice("Hello there"), cache=False) as client:
        c = client.chat(ASK, tools=[WEATHER])
        assert c.text == "Hello there" and c.tool_calls == [] and c.finish_reason == "stop"


def test_a_device_that_reads_tools_is_routed_and_stands_in_for_a_dead_cloud(cloud_url: str) -> None:
    edge = ToolDevice()
    easy = RoutingPolicy(EasyRouter(), privacy="off")
    with HybridLLM(edge=edge, cloud_url=cloud_url, cache=False, policy=easy) as client:
        c = client.chat(ASK, tools=[WEATHER])
        assert c.route == "edge" and c.score == 0.1 and c.tool_calls  # the router kept it on the device
    with HybridLLM(edge=edge, cloud_url=cloud_url, cache=False, policy=HARD) as client:
        assert client.chat(ASK, tools=[WEATHER], max_tokens=200).route == "cloud"  # ... or sent it up
    dead = f"http://127.0.0.1:{_free_port()}/v1"
    with HybridLLM(edge=edge, cloud_url=dead, cache=False, policy=HARD, cloud_max_retries=0) as client:
        c = client.chat(ASK, tools=[WEATHER])
        assert c.route == "edge (cloud unavailable)" and c.tool_calls[0].function.name == "get_weather"


def test_a_proxy_without_a_cloud_answers_tools_on_a_device_that_reads_them() -> None:
    client = HybridLLM(edge=ToolDevice(), cache=False)
    server, base = _serve(create_proxy_app(client))
    with client, serving(server, start_s=30):
        api = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        r = api.chat.completions.create(
            model="hybridllm", messages=[{"role": "user", "content": ASK}], tools=[WEATHER]
        )
    assert r.choices[0].finish_reason == "tool_calls" and r.model_extra["hybridllm"]["route"] == "edge"
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_privacy_keep_on_device_keeps_tools_on_a_device_that_reads_them(cloud_url: str) -> None:
    policy = RoutingPolicy(HardRouter(), privacy="keep_on_device")
    with HybridLLM(edge=ToolDevice(), cloud_url=cloud_url, policy=policy, cache=False) as client:
        c = client.chat("Mail jane.doe@example.com the weather in Paris", tools=[WEATHER])
    assert c.route == "edge" and "privacy" in c.reason and c.tool_calls


class NamelessCloud(FakeBackend):
    """A custom cloud backend whose tool call never names its function."""

    def stream(self, messages: Any, params: Any) -> Iterator[Any]:
        from hybridllm.backends.base import Delta

        yield Delta("", tool_calls=[ToolCallDelta(0, "c1", None, "{}")])
        yield Delta("", finish_reason="tool_calls")


def test_a_custom_clouds_malformed_call_is_a_clear_error() -> None:
    with HybridLLM(edge=FakeBackend(), cloud=NamelessCloud(), policy=HARD, cache=False) as client:
        with pytest.raises(CloudUnavailableError, match="malformed tool call"):
            client.chat(ASK, tools=[WEATHER])


def _short_device() -> Any:
    from hybridllm.backends.base import Delta, DeviceBackend
    from hybridllm.prompts import PromptFormat

    class Device(DeviceBackend):
        name, model = "short", "short-device"
        prompt_format = PromptFormat(
            chat_template="{% for m in messages %}{{ m.content }}{% endfor %}{{ tools }}"
        )

        def tokenize(self, messages: Any, *, prefix: str = "", tools: Any = None) -> list[int]:
            return [0] * (sum(len(str(m["content"]).split()) for m in messages) + (500 if tools else 0))

        @property
        def context_length(self) -> int:
            return 200

        def _run(self, tokens: list[int], params: Any, stops: Any) -> Iterator[Any]:
            yield Delta(CALL)
            yield Delta("", finish_reason="stop")

    return Device()


def test_a_device_whose_context_the_tools_overflow_sends_the_request_to_the_cloud(cloud_url: str) -> None:
    """The plan counts the device's prompt with the tools its template lists: a request that fits
    without them but not with them goes to the cloud (before, it stayed on the device, which then
    failed with ContextWindowExceededError)."""
    easy = RoutingPolicy(EasyRouter(), privacy="off")
    edge = _short_device()
    assert edge.calls_tools()
    with HybridLLM(edge=edge, cloud_url=cloud_url, cache=False, policy=easy) as client:
        c = client.chat(ASK, tools=[WEATHER], max_tokens=200)
        assert c.route == "cloud" and "too long for the device" in c.reason, c.reason
        assert client.chat(ASK, tools=[WEATHER], tool_choice="none").route == "edge"  # no tools shown
