"""Function calling on the cloud server (review 35): ``tools`` and ``tool_choice`` accepted and
checked, the answer read back as tool calls (streamed and not), the conversation's earlier calls
given to the template. Before, any ``tools`` was a 400. The real model's answers are in
``test_real_tools_review35.py``; here the request models, the reader and a fake engine's app."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cloud_server.api.protocol import ChatCompletionRequest, CloudChatCompletionRequest, parse_request
from cloud_server.api.server import create_app
from cloud_server.api.tools import ToolPlan
from hybridllm.wire.errors import WireError

from .fake_engine import CharTokenizer, FakeEngine
from .helpers import sse_payloads

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
# a tool whose parameters the grammar core cannot serve (a backreference)
BACKREF = {
    "type": "function",
    "function": {
        "name": "f",
        "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "(a)\\1"}}},
    },
}


def cloud(**fields: Any) -> CloudChatCompletionRequest:
    return parse_request(CloudChatCompletionRequest, {"model": "m", "messages": ASK, **fields})


def refused(**fields: Any) -> WireError:
    with pytest.raises(WireError) as err:
        cloud(**fields)
    return err.value


# -- the request ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tools", "param", "words"),
    [
        ([{"type": "retrieval"}], "tools[0].type", "only 'function'"),
        ([{"type": "function"}], "tools[0].function", "Missing"),
        ([{"type": "function", "function": {"name": "get weather"}}], "tools[0].function.name", "match"),
        ([{"type": "function", "function": {"name": "x" * 65}}], "tools[0].function.name", "match"),
        ([WEATHER, WEATHER], "tools[1].function.name", "two tools"),
        (
            [{"type": "function", "function": {"name": "f", "params": {}}}],
            "tools[0].function.params",
            "Unrecognized",
        ),
        (
            [{"type": "function", "function": {"name": "f", "parameters": []}}],
            "tools[0].function.parameters",
            "JSON schema",
        ),
        (
            [{"type": "function", "function": {"name": "f", "description": 3}}],
            "tools[0].function.description",
            "string",
        ),
        ([{"type": "function", "function": {"name": "f"}, "x": 1}], "tools[0].x", "Unrecognized"),
        ([], "tools", "empty array"),
        (
            [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)],
            "tools",
            "maximum length 128",
        ),
    ],
)
def test_a_malformed_tool_is_a_400_naming_its_field(tools: list, param: str, words: str) -> None:
    err = refused(tools=tools)
    assert err.param == param and words in str(err), (err.param, str(err))


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tool_choice": "auto"}, "tool_choice", "only allowed when tools"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            "tool_choice",
            "only allowed when tools",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "add"}}},
            "tool_choice",
            "no function named 'add'",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}},
            "tool_choice",
            "Expected",
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", ""),
        (
            {"tools": [WEATHER], "response_format": {"type": "json_object"}},
            "response_format",
            "cannot be combined",
        ),
        (
            {"tools": [WEATHER], "structured_outputs": {"choice": ["a"]}},
            "structured_outputs",
            "cannot be combined",
        ),
        ({"tools": [WEATHER], "logprobs": True}, "logprobs", "not served beside tools"),
        # a forced call's grammar: a schema the core cannot serve is named where the request has it
        (
            {
                "tools": [WEATHER, BACKREF],
                "tool_choice": "required",
            },
            "tools[1].function.parameters.properties.x.pattern",
            "backreferences",
        ),
        (
            {
                "tools": [BACKREF],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "tools[0].function.parameters.properties.x.pattern",
            "backreferences",
        ),
    ],
)
def test_a_tool_choice_that_cannot_be_served_is_a_400(fields: dict, param: str, words: str) -> None:
    err = refused(**fields)
    assert err.param == param and words.lower() in str(err).lower(), (err.param, str(err))


def test_the_plan_follows_tool_choice() -> None:
    assert cloud().tool_plan() is None
    assert cloud(tools=[WEATHER], tool_choice="none").tool_plan() is None  # a text answer
    assert cloud(tools=[WEATHER], tool_choice="none").response_grammar() is None
    auto = cloud(tools=[WEATHER, ADD])
    # the model chooses; the calls it makes are held to their tools' schemas (review 37)
    assert auto.tool_plan().mode == "auto" and auto.response_grammar().kind == "tool_calls"
    assert auto.response_grammar().names == ["get_weather", "add"]
    required = cloud(tools=[WEATHER, ADD], tool_choice="required")
    assert required.tool_plan().mode == "required" and required.response_grammar() is not None
    named = cloud(tools=[WEATHER, ADD], tool_choice={"type": "function", "function": {"name": "add"}})
    assert (named.tool_plan().mode, named.tool_plan().name) == ("named", "add")
    # tool_choice "none" beside a response_format: the format holds, no tools
    assert cloud(
        tools=[WEATHER], tool_choice="none", response_format={"type": "json_object"}
    ).response_grammar()


def test_the_proxy_still_refuses_tools() -> None:
    # hybridllm serve's model: its device route has no function calling
    with pytest.raises(WireError) as err:
        parse_request(ChatCompletionRequest, {"model": "m", "messages": ASK, "tools": [WEATHER]})
    assert err.value.param == "tools"


def test_a_forced_call_grammar_allows_calls_of_the_tools_only() -> None:
    required = cloud(tools=[WEATHER, ADD], tool_choice="required").response_grammar()
    assert required.validate('[{"name": "add", "arguments": {"a": 1, "b": 2}}]')
    assert required.validate(
        '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
        '{"name": "add", "arguments": {"a": 1, "b": 2}}]'
    )
    assert not required.validate("[]")  # at least one call
    assert not required.validate('[{"name": "sub", "arguments": {"a": 1, "b": 2}}]')  # no such tool
    assert not required.validate('[{"name": "add", "arguments": {"a": "1", "b": 2}}]')  # its schema
    assert not required.validate('[{"name": "get_weather", "arguments": {"a": 1, "b": 2}}]')
    one = cloud(tools=[WEATHER, ADD], tool_choice="required", parallel_tool_calls=False).response_grammar()
    assert one.validate('[{"name": "add", "arguments": {"a": 1, "b": 2}}]')
    assert not one.validate(
        '[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "add", "arguments": {"a": 3, "b": 4}}]'
    )
    named = cloud(tools=[WEATHER, ADD], tool_choice={"type": "function", "function": {"name": "add"}})
    assert named.response_grammar().validate('{"a": 1, "b": 2}')
    assert not named.response_grammar().validate('{"city": "Oslo"}')
    # a function without parameters takes none: an empty object
    bare = cloud(tools=[{"type": "function", "function": {"name": "now"}}], tool_choice="required")
    assert bare.response_grammar().validate('[{"name": "now", "arguments": {}}]')


def test_each_tools_defs_are_found_by_their_refs() -> None:
    def tool(name: str, defs_value: dict) -> dict:
        return {
            "type": "function",
            "function": {
                "name": name,
                "parameters": {
                    "type": "object",
                    "properties": {"p": {"$ref": "#/$defs/P"}},
                    "required": ["p"],
                    "$defs": {"P": defs_value},
                },
            },
        }

    point = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    ok = cloud(tools=[tool("f", point), tool("g", point)], tool_choice="required").response_grammar()
    assert ok.validate('[{"name": "g", "arguments": {"p": {"x": 1}}}]')
    assert not ok.validate('[{"name": "g", "arguments": {"p": {"x": "1"}}}]')
    err = refused(tools=[tool("f", point), tool("g", {"type": "string"})], tool_choice="required")
    assert err.param == "tools[1].function.parameters.$defs.P"


def test_earlier_calls_and_results_reach_the_template() -> None:
    req = cloud(
        tools=[WEATHER],
        messages=[
            *ASK,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": "not json"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"c": 18}'},
        ],
    )
    sent = req.chat_messages()
    # the arguments as the object the templates write with | tojson; a text that is not JSON stays
    assert sent[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert sent[1]["tool_calls"][1]["function"]["arguments"] == "not json"
    assert sent[1]["content"] == "" and sent[2]["tool_call_id"] == "call_1"
    with pytest.raises(WireError) as err:
        cloud(
            messages=[*ASK, {"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]}]
        ).chat_messages()
    assert err.value.param == "messages[1].tool_calls[0]"


# -- reading the answer --------------------------------------------------------------------------


def read(plan: ToolPlan, pieces: list[str], reason: str = "stop") -> tuple[str, str | None, list, str]:
    """(the text streamed, in order, the answer's content, the calls, the finish reason)"""
    reader = plan.reader()
    streamed = "".join(reader.feed(p) for p in pieces)
    rest, calls, reason = reader.finish(reason)
    return (
        streamed + rest,
        reader.content(),
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls],
        reason,
    )


AUTO = ToolPlan([WEATHER, ADD], "auto")


def chars(text: str) -> list[str]:
    return list(text)  # one character a delta: every place a marker may be cut


def test_auto_reads_tagged_calls_and_streams_the_text_before_them() -> None:
    answer = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    )
    for pieces in (chars(answer), [answer]):
        streamed, content, calls, reason = read(AUTO, pieces)
        assert streamed == content == "Let me check.\n"
        assert (
            calls == [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})]
            and reason == "tool_calls"
        )
    # parallel_tool_calls false: the first call only
    assert read(ToolPlan([WEATHER, ADD], "auto", parallel=False), [answer])[2] == [
        ("get_weather", {"city": "Paris"})
    ]
    # a call left open at the answer's end (it stopped at its end of turn) is still a call
    assert read(AUTO, ['<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}'])[2] == [
        ("add", {"a": 1, "b": 2})
    ]


def test_auto_reads_a_bare_call_and_keeps_other_json_as_text() -> None:
    bare = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    streamed, content, calls, reason = read(AUTO, chars(bare))
    assert (streamed, content, reason) == ("", None, "tool_calls")
    assert calls == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    two = bare + '\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}'  # arguments as a JSON text too
    assert read(AUTO, [two])[2] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}),
        ("add", {"a": 1, "b": 2}),
    ]
    for text in (
        '{"name": "say_hello", "arguments": {}}',  # no such tool
        '{"city": "Paris"}',  # JSON, not a call
        '{"name": "add", "arguments": [1, 2]}',  # arguments not an object
    ):
        streamed, content, calls, reason = read(AUTO, chars(text), reason="stop")
        assert (streamed, content, calls, reason) == (text, text, [], "stop"), text
    # review 37: a bare call begun at the answer's start is a call, as a tagged one is (the hold
    # of auto calls makes it whole and valid): prose after it is dropped, and one cut by
    # max_tokens keeps its partial arguments (before: both were the model's text)
    assert read(AUTO, chars(bare + "\nThat is all.")) == (
        "",
        None,
        [("get_weather", {"city": "Paris", "unit": "celsius"})],
        "tool_calls",
    )
    cut = AUTO.reader()
    for ch in '{"name": "get_weather", "arguments": {"city": "Pa':
        assert cut.feed(ch) == ""
    text, cut_calls, reason = cut.finish("length")
    assert (text, cut_calls[0]["function"]["arguments"], reason) == ("", '{"city": "Pa', "length")


def test_auto_reads_calls_in_a_json_block_alone() -> None:
    # as Qwen2.5-Coder-1.5B writes its calls
    fenced = '```json\n{\n  "name": "add",\n  "arguments": {\n    "a": 1234,\n    "b": 4321\n  }\n}\n```'
    for pieces in (chars(fenced), [fenced]):
        assert read(AUTO, pieces) == ("", None, [("add", {"a": 1234, "b": 4321})], "tool_calls")
    # a block with something else, or prose around it, is the model's text; so is a code block
    # in another language, which streams as it comes
    for text in (
        '```json\n{"a": 1}\n```',
        'Here:\n```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```',
    ):
        assert read(AUTO, chars(text))[:3] == (text, text, []), text
    # review 37: a block that begins with a call is a call, whatever follows it (before: text)
    done = '```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```\nDone.'
    assert read(AUTO, chars(done)) == ("", None, [("add", {"a": 1, "b": 2})], "tool_calls")
    reader = AUTO.reader()
    code = "```python\nprint(1)\n```"
    assert "".join(reader.feed(ch) for ch in code[:12]) == code[:12]  # not held: not a JSON block


def test_auto_text_streams_and_a_tag_like_text_is_not_lost() -> None:
    text = "Use <tool> tags, or <tool_call without closing, and 3 < 4."
    reader = AUTO.reader()
    sent = [reader.feed(ch) for ch in text]
    assert "".join(sent) + reader.finish("stop")[0] == text
    assert sum(1 for s in sent if s) > len(text) // 2  # streamed as it came, not held to the end
    # a tagged block whose JSON is not a call: all of it is the answer's text
    broken = "Here: <tool_call>\n{not json}\n</tool_call>"
    assert read(AUTO, chars(broken))[:3] == (broken, broken, [])
    # cut at max_tokens inside a call: the reason stays "length", the text is the answer
    assert read(AUTO, ['<tool_call>\n{"name": "add"'], reason="length")[2:] == ([], "length")


def test_forced_answers_are_calls() -> None:
    required = ToolPlan([WEATHER, ADD], "required")
    answer = (
        '[{"name": "add", "arguments": {"a": 1, "b": 2}}, '
        '{"name": "get_weather", "arguments": {"city": "Rome"}}]'
    )
    assert read(required, chars(answer)) == (
        "",
        None,
        [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Rome"})],
        "tool_calls",
    )
    # whitespace anywhere the grammar allows it (a newline and an indent), one character at a time
    spaced = '[\n  {\n    "name": "add",\n    "arguments": {\n      "a": 1,\n      "b": 2\n    }\n  }\n]'
    assert read(required, chars(spaced))[2:] == ([("add", {"a": 1, "b": 2})], "tool_calls")
    # cut short by max_tokens: the calls written so far, the last with its arguments so far (as a
    # named function's); cut before any call's name, the text is the answer
    reader = required.reader()
    reader.feed('[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "add", "arguments": {"a": 1')
    _, calls, reason = reader.finish("length")
    assert [c["function"]["arguments"] for c in calls] == [
        '{"a": 1, "b": 2}',
        '{"a": 1',
    ] and reason == "length"
    assert read(required, ['[{"name": "ad'], reason="length") == (
        '[{"name": "ad',
        '[{"name": "ad',
        [],
        "length",
    )
    named = ToolPlan([WEATHER, ADD], "named", "add")
    # OpenAI's finish for a named function is "stop"
    assert read(named, chars('{"a": 1, "b": 2}')) == ("", None, [("add", {"a": 1, "b": 2})], "stop")


def test_required_calls_stream_as_they_come() -> None:
    reader = ToolPlan([WEATHER, ADD], "required").reader()
    answer = (
        '[{"name": "get_weather", "arguments": {"city": "Ro\\"me}"}}, '
        '{"name": "add", "arguments": {"a": [1]}}]'
    )
    deltas = []
    for ch in answer:
        reader.feed(ch)
        deltas += reader.take_deltas()
    starts = [d for d in deltas if "id" in d]
    assert [(d["index"], d["function"]["name"]) for d in starts] == [(0, "get_weather"), (1, "add")]
    # a call's start comes before its arguments, which come a character at a time here
    args = {i: "".join(d["function"]["arguments"] for d in deltas if d["index"] == i) for i in (0, 1)}
    assert args == {0: '{"city": "Ro\\"me}"}', 1: '{"a": [1]}'}  # a quote and a brace inside a string
    _, calls, reason = reader.finish("stop")
    assert reader.streamed == 2 and [c["id"] for c in calls] == [d["id"] for d in starts]
    assert [c["function"]["arguments"] for c in calls] == [args[0], args[1]] and reason == "tool_calls"


def test_a_named_functions_arguments_stream_as_they_come() -> None:
    reader = ToolPlan([WEATHER, ADD], "named", "add").reader()
    deltas = []
    for piece in ["\n", '{"a"', ": 1,", ' "b": 2', "}"]:
        assert reader.feed(piece) == ""  # no text: all of it is the call's
        deltas.append(reader.take_deltas())
    assert deltas[0] == []  # whitespace first: nothing to send yet
    first = deltas[1][0]
    assert first["type"] == "function" and first["function"] == {"name": "add", "arguments": '{"a"'}
    rest = [d["function"]["arguments"] for batch in deltas[2:] for d in batch]
    assert rest == [": 1,", ' "b": 2', "}"] and all(
        set(d) == {"index", "function"} for b in deltas[2:] for d in b
    )
    _, calls, reason = reader.finish("stop")
    assert reader.streamed == 1 and calls[0]["id"] == first["id"]  # the same call, not sent again
    assert calls[0]["function"]["arguments"] == '{"a": 1, "b": 2}' and reason == "stop"
    # cut short by max_tokens: the call keeps the arguments written so far, as OpenAI's does
    cut = ToolPlan([WEATHER, ADD], "named", "add").reader()
    cut.feed('{"a": 1, "b"')
    _, calls, reason = cut.finish("length")
    assert calls[0]["function"]["arguments"] == '{"a": 1, "b"' and reason == "length"


# -- through the app (a fake engine answers with a call) -----------------------------------------


class _ToolTokenizer(CharTokenizer):
    """The fake's tokenizer with a template that lists the tools (what the app passes it)."""

    seen_tools: Any = None

    def encode_chat(  # type: ignore[override]
        self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True, tools: Any = None
    ) -> list[int]:
        type(self).seen_tools = tools
        return self.encode(self.apply_chat_template(messages) + json.dumps(tools or []))


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture()
def app_client() -> Any:
    def factory() -> FakeEngine:
        engine = FakeEngine(step_s=0.0, reply=CALL, max_model_len=4096)
        engine.tokenizer = _ToolTokenizer()
        return engine

    with TestClient(create_app(factory)) as client:
        yield client


def test_the_app_answers_with_tool_calls_streamed_or_not(app_client: Any) -> None:
    body = {"model": "fake-model", "messages": ASK, "tools": [WEATHER], "max_tokens": 200}
    r = app_client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert _ToolTokenizer.seen_tools == [WEATHER]  # the template was given the tools
    with app_client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
        events = sse_payloads(s.iter_lines())
    chunks = [e for e in events if isinstance(e, dict)]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert not any(d.get("content") for d in deltas)  # the call's text is not sent as text
    calls = [t for d in deltas for t in d.get("tool_calls", [])]
    # (review 36) a tagged auto call streams too: its name first, then its arguments as written
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    assert all(c["index"] == 0 and "id" not in c for c in calls[1:])
    assert "".join(c["function"]["arguments"] for c in calls) == call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # tool_choice none: the tools are not shown and the text is the answer
    r = app_client.post("/v1/chat/completions", json={**body, "tool_choice": "none"})
    assert (
        r.json()["choices"][0]["message"]["content"] == CALL
        and "tool_calls" not in r.json()["choices"][0]["message"]
    )
    assert _ToolTokenizer.seen_tools is None


def test_each_of_n_choices_is_read_alone(app_client: Any) -> None:
    body = {"model": "fake-model", "messages": ASK, "tools": [WEATHER], "max_tokens": 200, "n": 2}
    choices = app_client.post("/v1/chat/completions", json=body).json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    ids = [c["message"]["tool_calls"][0]["id"] for c in choices]
    assert len(set(ids)) == 2 and all(c["finish_reason"] == "tool_calls" for c in choices)
    with app_client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
        chunks = [e for e in sse_payloads(s.iter_lines()) if isinstance(e, dict) and e["choices"]]
    called = sorted({c["choices"][0]["index"] for c in chunks if "tool_calls" in c["choices"][0]["delta"]})
    finished = sorted(
        (c["choices"][0]["index"], c["choices"][0]["finish_reason"])
        for c in chunks
        if c["choices"][0]["finish_reason"]
    )
    assert called == [0, 1] and finished == [(0, "tool_calls"), (1, "tool_calls")]


def test_a_named_call_streams_its_arguments_through_the_app() -> None:
    args = '{"city": "Paris"}'

    def factory() -> FakeEngine:
        engine = FakeEngine(step_s=0.0, reply=args, max_model_len=4096)
        engine.tokenizer = _ToolTokenizer()
        return engine

    body = {
        "model": "fake-model",
        "messages": ASK,
        "tools": [WEATHER, ADD],
        "max_tokens": 200,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    with TestClient(create_app(factory)) as client:
        whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
            chunks = [e for e in sse_payloads(s.iter_lines()) if isinstance(e, dict) and e["choices"]]
    assert whole["message"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": args}
    assert whole["finish_reason"] == "stop"
    deltas = [t for c in chunks for t in c["choices"][0]["delta"].get("tool_calls", [])]
    assert len(deltas) == len(args)  # one a token (the fake's token is a character)
    assert deltas[0]["function"]["name"] == "get_weather" and deltas[0]["id"].startswith("call_")
    assert all(d["index"] == 0 for d in deltas) and all("id" not in d for d in deltas[1:])
    assert "".join(d["function"]["arguments"] for d in deltas) == args
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_tagged_auto_call_streams_once_its_name_is_out_review36() -> None:
    """(review 36) Before, an auto answer's calls came whole at its end; a Hermes-tagged call now
    begins as soon as its name is out and its arguments stream as written (vLLM's and OpenAI's
    behaviour). (Review 37: bare and fenced calls at the answer's start stream too.)"""
    answer = (
        'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    )
    reader = AUTO.reader()
    seen: list[tuple[int, dict]] = []
    text = ""
    for i, ch in enumerate(answer):
        text += reader.feed(ch)
        seen += [(i, d) for d in reader.take_deltas()]
    _, calls, reason = reader.finish("stop")
    heads = [(i, d["function"]["name"]) for i, d in seen if "id" in d]
    # each call began before the answer ended: the first when its name was out
    assert [name for _, name in heads] == ["get_weather", "add"] and heads[0][0] < answer.index('"city"')
    args = {0: "", 1: ""}
    for _, d in seen:
        args[d["index"]] += d["function"]["arguments"]
    assert args == {0: '{"city": "Paris"}', 1: '{"a": 1, "b": 2}'}
    assert (
        text == "Sure.\n"
        and reason == "tool_calls"
        and [c["id"] for c in calls] == [d["id"] for _, d in seen if "id" in d]
    )
    # cut by max_tokens inside the call: it keeps its partial arguments, "length"
    cut = AUTO.reader()
    cut.feed('<tool_call>\n{"name": "add", "arguments": {"a": 1')
    assert [d["function"]["arguments"] for d in cut.take_deltas()] == ["", '{"a": 1']
    _, cut_calls, cut_reason = cut.finish("length")
    assert cut_reason == "length" and cut_calls[0]["function"] == {"name": "add", "arguments": '{"a": 1'}
    # a tag naming no listed tool: not a call, the text as written (as before)
    other = '<tool_call>\n{"name": "say_hello", "arguments": {}}\n</tool_call>'
    assert read(AUTO, chars(other)) == (other, other, [], "stop")
    # review 37: a bare call streams too, once its name is out (it was read whole at the end)
    bare = AUTO.reader()
    assert bare.feed('{"name": "add", "arguments": {"a": 1') == ""
    assert [(d.get("function", {}).get("name"), d["function"]["arguments"]) for d in bare.take_deltas()] == [
        ("add", ""),
        (None, '{"a": 1'),
    ]
    bare.feed(', "b": 2}}')
    assert bare.take_deltas()[0]["function"]["arguments"] == ', "b": 2}'
    _, bare_calls, bare_reason = bare.finish("stop")
    assert bare_reason == "tool_calls" and [c["function"] for c in bare_calls] == [
        {"name": "add", "arguments": '{"a": 1, "b": 2}'}
    ]
