"""Request models of the OpenAI wire format: the shared ones in ``hybridllm.wire``.

The cloud server and the local proxy accept the same bodies with the same checks (strict types,
unknown fields refused, unsupported features a 400 naming the parameter); see
``hybridllm/wire/requests.py`` for what is accepted and why. One difference: this server reports
token log-probabilities (``CloudChatCompletionRequest``, ``CloudCompletionRequest``), which the
proxy refuses, since its device route cannot always give them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from hybridllm.wire.errors import WireError
from hybridllm.wire.fields import _INTEGRAL
from hybridllm.wire.requests import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingRequest,
    StreamOptions,
    TextPart,
    parse_request,
)


class CloudChatCompletionRequest(ChatCompletionRequest):
    """A chat body with OpenAI's ``logprobs`` (bool) and ``top_logprobs`` (0..20) served."""

    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20), _INTEGRAL] | None = None

    # same names as the shared model's refusing validators: these replace them
    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: bool | None) -> bool | None:
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, value: int | None) -> int | None:
        return value

    @model_validator(mode="after")
    def _top_needs_logprobs(self) -> CloudChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise WireError("top_logprobs needs logprobs set to true.", param="top_logprobs")
        return self

    @model_validator(mode="after")
    def _no_empty_part_lists(self) -> CloudChatCompletionRequest:
        # OpenAI's 400 for "content": [] (the model was asked an empty turn); hybridllm serve and
        # the library refuse it too
        for i, message in enumerate(self.messages):
            if isinstance(message.content, list) and not message.content:
                raise WireError(f"Invalid 'messages[{i}].content': empty array. Expected an array with "
                                "minimum length 1, but got an empty array instead.",
                                param=f"messages[{i}].content", code="empty_array")
        return self

    def chat_messages(self) -> list[dict[str, str]]:
        # a message's "name" (a participant's name, a tool's) reaches the chat template: one that
        # reads message.name gets it; the Qwen and SmolLM templates ignore it. Its text is the
        # message's own, so control-token text in it stays plain text (hybridllm._prompt_tokens).
        out = super().chat_messages()
        for message, sent in zip(self.messages, out, strict=True):
            if message.name:
                sent["name"] = message.name
        return out

    def num_logprobs(self) -> int | None:
        """None: no log-probabilities; N: each token's and its N most likely alternatives."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CloudCompletionRequest(CompletionRequest):
    """A legacy completions body with ``logprobs`` (0..5 alternatives per token) served."""

    logprobs: Annotated[int, Field(ge=0, le=5), _INTEGRAL] | None = None

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: int | None) -> int | None:
        return value

    def num_logprobs(self) -> int | None:
        return self.logprobs


__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CloudChatCompletionRequest",
    "CloudCompletionRequest",
    "CompletionRequest",
    "SamplingRequest",
    "StreamOptions",
    "TextPart",
    "parse_request",
]
