"""Request models: what is accepted, normalized and rejected before the engine sees anything."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cloud_server.api.protocol import ChatCompletionRequest, CompletionRequest
from cloud_server.exceptions import InvalidRequestError


def chat(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_messages_normalized_for_the_template() -> None:
    req = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None, "name": "bot"},
            ],
        }
    )
    assert req.chat_messages() == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": ""},
    ]


def test_limits_and_stop() -> None:
    assert chat(max_tokens=5, max_completion_tokens=7).output_limit() == 7
    assert chat().output_limit() is None
    assert chat(stop="x").stop_list() == ["x"]
    assert chat(stream=True, stream_options={"include_usage": True}).include_usage()
    with pytest.raises(ValidationError):
        chat(stop=["a", "b", "c", "d", "e"])
    with pytest.raises(ValidationError):
        chat(top_p=0)
    with pytest.raises(ValidationError):
        chat(stream_options={"include_usage": True, "extra": 1}, stream=True)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 3}, "n"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logprobs": True}, "logprobs"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_unsupported_options_rejected_not_ignored(fields: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        chat(**fields)
    assert info.value.param == param


def test_completion_prompts() -> None:
    assert CompletionRequest.model_validate({"model": "m", "prompt": "x"}).single_prompt() == "x"
    assert CompletionRequest.model_validate({"model": "m", "prompt": [1, 2]}).single_prompt() == [
        1,
        2,
    ]
    assert CompletionRequest.model_validate({"model": "m", "prompt": [[3]]}).single_prompt() == [3]
    assert CompletionRequest.model_validate({"model": "m", "prompt": "x"}).output_limit() == 16
    with pytest.raises(InvalidRequestError):
        CompletionRequest.model_validate({"model": "m", "prompt": ["a", "b"]})
    with pytest.raises(InvalidRequestError):
        CompletionRequest.model_validate({"model": "m", "prompt": []}).single_prompt()
    with pytest.raises(InvalidRequestError):
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "echo": True})
