"""Request models (shared with the proxy): what is accepted, normalized and rejected."""

from __future__ import annotations

import pytest

from cloud_server.api.protocol import ChatCompletionRequest, CompletionRequest, parse_request
from hybridllm.wire import WireError, decode_json_object
from hybridllm.wire.requests import MAX_STOP

MSGS = [{"role": "user", "content": "hi"}]


def chat(**fields: object) -> ChatCompletionRequest:
    return parse_request(ChatCompletionRequest, {"model": "m", "messages": MSGS, **fields})


def rejected(**fields: object) -> WireError:
    with pytest.raises(WireError) as info:
        chat(**fields)
    assert info.value.status == 400
    return info.value


def test_messages_normalized_for_the_template() -> None:
    req = parse_request(
        ChatCompletionRequest,
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": None, "name": "bot"},
            ],
        },
    )
    assert req.chat_messages() == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb"},  # parts joined as the edge's prompt module joins them
        {"role": "assistant", "content": ""},
    ]


def test_limits_and_stop() -> None:
    assert chat(max_tokens=5, max_completion_tokens=7).output_limit() == 7
    assert chat().output_limit() is None
    assert chat(stop="x").stop_list() == ["x"]
    assert chat(stream=True, stream_options={"include_usage": True}).include_usage()
    assert chat(temperature=1).temperature == 1.0  # an integer is a number
    assert chat(max_tokens=5.0).max_tokens == 5  # and 5.0 is the integer 5, as in JSON Schema
    # the list branch's error, not "a valid string" (past MAX_STOP: more than OpenAI's 4 are served)
    too_many = rejected(stop=[f"s{i}" for i in range(MAX_STOP + 1)])
    assert too_many.param == "stop" and f"at most this many items: {MAX_STOP}" in str(too_many), str(too_many)
    assert "valid string" in str(rejected(stop=5))  # no branch fits: the first one's type error
    assert rejected(top_p=0).param == "top_p"
    assert rejected(stream_options={"include_usage": True, "extra": 1}, stream=True).param == (
        "stream_options.extra"
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 3}, "n"),
        ({"presence_penalty": 2.5}, "presence_penalty"),  # served in [-2, 2] since review 31
        ({"logprobs": True}, "logprobs"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        # json_object and json_schema are served (review 32): a schema beside another type is not
        ({"response_format": {"type": "json_object", "json_schema": {}}}, "response_format.json_schema"),
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"schema": {"type": "string", "pattern": "(a)\\1"}}}},
         "response_format.json_schema.schema.pattern"),
        ({"logit_bias": {"42": 5}}, "logit_bias"),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
def test_unsupported_options_rejected_not_ignored(fields: dict[str, object], param: str) -> None:
    assert rejected(**fields).param == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"seed": 1180591620717411303424}, "seed"),  # past 64 bits: torch cannot seed with it
        ({"seed": -(2**63) - 1}, "seed"),
        ({"top_p": 1e-300}, "top_p"),  # rounds to 0 in float32 and would drop every token
        ({"top_p": 1e-39}, "top_p"),  # a float32 subnormal
        ({"max_tokens": 10**30}, "max_tokens"),
        ({"top_k": 10**30}, "top_k"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0]"),
        ({"stop_token_ids": [2**40]}, "stop_token_ids[0]"),
        ({"temperature": 2.5}, "temperature"),
    ],
)
def test_values_the_engine_cannot_honour_are_400(fields: dict[str, object], param: str) -> None:
    assert rejected(**fields).param == param


def test_edge_of_the_representable_is_accepted() -> None:
    assert chat(seed=2**64 - 1).seed == 2**64 - 1
    assert chat(seed=-(2**63)).seed == -(2**63)
    assert chat(top_p=1.1754943508222875e-38).top_p == 1.1754943508222875e-38


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stream": "yes"}, "stream"),  # no coercion of strings to booleans
        ({"stream": 1}, "stream"),
        ({"max_tokens": 5.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": "0.5"}, "temperature"),
        ({"stop": 5}, "stop"),
        ({"stop": True}, "stop"),
        ({"stream_options": "x"}, "stream_options"),
        ({"model": 123}, "model"),
        ({"messages": "hi"}, "messages"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": {}}]}]},
            "messages[0].content[0].text",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content",
        ),
        ({"messages": [{"role": "user"}]}, "messages[0]"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ],
)
def test_strict_types(fields: dict[str, object], param: str) -> None:
    assert rejected(**fields).param == param


def test_image_parts_are_refused_with_a_reason() -> None:
    content = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    err = rejected(messages=[{"role": "user", "content": content}])
    assert "text only" in err.message


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "hi \\ud800 there"}]}',
            "messages[0].content",
            "surrogate",
        ),
        (b'{"a": NaN}', None, "JSON"),
        (b"[" * 2000 + b"]" * 2000, None, "nested"),
        (b'{"x": ' + b"[" * 40 + b"]" * 40 + b"}", "x", "nested"),
        (b"\xff\xfe", None, "JSON"),
        (b"[1]", None, "object"),
    ],
)
def test_body_decoding(body: bytes, param: str | None, fragment: str) -> None:
    with pytest.raises(WireError) as info:
        decode_json_object(body)
    assert info.value.param == param and fragment in info.value.message


def test_completion_prompts() -> None:
    def completion(**fields: object) -> CompletionRequest:
        return parse_request(CompletionRequest, {"model": "m", **fields})

    assert completion(prompt="x").single_prompt() == "x"
    assert completion(prompt=[1, 2]).single_prompt() == [1, 2]
    assert completion(prompt=[[3]]).single_prompt() == [3]
    assert completion(prompt="x").output_limit() == 16
    for bad in (
        {"prompt": ["a", "b"]},
        {"prompt": []},
        {"prompt": "x", "echo": True},
        {"prompt": [-1]},
        {"prompt": "x", "best_of": 2},
    ):
        with pytest.raises(WireError) as info:
            completion(**bad)
        assert info.value.param in {"prompt", "prompt[0]", "echo", "best_of"}
