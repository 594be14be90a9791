"""Request models of the OpenAI wire format, shared by the cloud server and the local proxy.

What OpenAI does, this does: unknown fields are a 400 ("Unrecognized request argument"), types
are strict (``"stream": "yes"`` is a 400, not ``True``), and parameters OpenAI knows but these
servers cannot honour are accepted only at their neutral value (``n=1``, no logprobs, no tools,
no ``logit_bias``, text-only content) and a 400 that names the parameter otherwise, so a client never
silently gets something other than what it asked for. ``response_format`` (text, json_object,
json_schema) is served by both, as a grammar over the answer's tokens (``hybridllm/_structured``):
a schema the grammar core refuses is a 400 naming the schema's field, before anything runs.
``presence_penalty`` and ``frequency_penalty`` (OpenAI's, in [-2, 2]) are served by both: the cloud
engine's sampler, the library's device backends and its cloud route apply them.

Values the engine cannot represent are refused here too: ``seed`` outside 64 bits, ``top_p`` below
float32's smallest normal number (it would round to 0 and drop every token), token counts past
int32, non-finite numbers; and lists whose length the engine pays for on every token
(``stop_token_ids`` past ``MAX_STOP_TOKEN_IDS``, ``stop`` past ``MAX_STOP`` strings or one past
``MAX_STOP_CHARS`` characters).

The chat and completion requests are defined here, from parts in the modules beside this one (each
name that was imported from here before still is): ``_sampling.py`` (the fields both share,
:class:`SamplingRequest`, and those bounds), ``_messages.py`` (:class:`ChatMessage` and its text
parts), ``_checked_parts.py`` (``response_format`` and the tools, checked by the library's cores).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, field_validator

from .._types import MAX_MODEL_CHARS  # noqa: F401 - re-exported: the bound on model names (tests read it here)
from ._checked_parts import (
    ResponseFormat,
    _as_wire,  # noqa: F401 - re-exported: cloud_server.api.protocol imports it here
    checked_calls,  # noqa: F401 - re-exported: hybridllm._proxy_request, cloud_server.api.tools
    checked_response_format,
    checked_tools,
    tool_choice_of,  # noqa: F401 - re-exported: hybridllm._proxy_request, cloud_server.api.tools
)
from ._messages import ChatMessage, TextPart  # noqa: F401 - TextPart: a public name of this module
from ._sampling import (  # noqa: F401 - the bounds and StreamOptions: public names of this module
    _STREAM_RULE,
    FLOAT32_TINY,
    MAX_STOP,
    MAX_STOP_CHARS,
    MAX_STOP_TOKEN_IDS,
    SEED_MAX,
    SEED_MIN,
    Penalty,
    SamplingRequest,
    StopString,
    StreamOptions,
)
from .errors import WireError
from .fields import _INTEGRAL, TokenCount, TokenId, only
from .validation import validation_error


class ChatCompletionRequest(SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: TokenCount | None = None
    logprobs: bool | None = only(enum=[False, None])
    top_logprobs: Annotated[int, Field(ge=0, le=20), _INTEGRAL] | None = only(maximum=0)
    tools: list[dict[str, Any]] | None = only(type="null")
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = only(enum=["none", None])
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # Accepted and ignored: nothing is stored, metadata is the caller's own.
    store: bool | None = None
    metadata: dict[str, str] | None = None

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("logprobs are not supported by this server")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise ValueError("logprobs are not supported by this server")
        return value

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if value == []:  # OpenAI's 400: leave tools out rather than send none
            raise WireError("Invalid 'tools': empty array. Expected an array with minimum length 1, "
                            "but got an empty array instead.", param="tools", code="empty_array")
        if value:
            raise ValueError("tools (function calling) are not supported by this server")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, value: Any) -> Any:
        if value not in (None, "none"):
            raise ValueError("tool_choice is only allowed when tools are specified")
        return value

    @field_validator("response_format")
    @classmethod
    def _format(cls, value: ResponseFormat | None) -> ResponseFormat | None:
        return checked_response_format(value)

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def limit_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def chat_messages(self) -> list[dict[str, str]]:
        # "developer" is OpenAI's new name for "system"; chat templates only know the latter. An
        # assistant turn that refused (content null or empty, its words in "refusal", as the official
        # clients echo a refused answer back) is its refusal text, as hybridllm.normalize_messages
        # reads it: the model sees what it said, not an empty turn.
        out = []
        for m in self.messages:
            text = m.text()
            if not text and m.role == "assistant" and m.refusal:
                text = m.refusal
            out.append({"role": "system" if m.role == "developer" else m.role, "content": text})
        return out


class ToolsChatRequest(ChatCompletionRequest):
    """A chat body whose ``tools`` are served (the cloud server's model calls them; ``hybridllm
    serve`` sends them to it): checked as OpenAI checks them, each error a 400 naming its field."""

    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None

    # same names as the refusing validators above: these replace them
    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[Any] | None) -> list[dict[str, Any]] | None:
        return checked_tools(value) if value is not None else value

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, value: Any) -> Any:
        return value


class CompletionRequest(SamplingRequest):
    """The legacy ``/v1/completions`` body: one prompt, text or token ids."""

    prompt: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=1)]
    )
    max_tokens: TokenCount | None = 16  # the legacy endpoint's own default
    echo: bool = Field(default=False, json_schema_extra={"enum": [False]})
    logprobs: Annotated[int, Field(ge=0, le=5), _INTEGRAL] | None = only(maximum=0)
    best_of: Annotated[int, Field(ge=1, le=20), _INTEGRAL] | None = only(maximum=1)
    suffix: str | None = only(maxLength=0)

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported by this server")
        return value

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise ValueError("logprobs are not supported by this server")
        return value

    @field_validator("best_of")
    @classmethod
    def _one_best(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("only best_of=1 is supported")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix is not supported by this server")
        return value

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) > 1 and isinstance(value[0], str | list):
            raise ValueError("batched prompts are not supported; send one prompt per request")
        if value == "" or value == []:
            raise ValueError("the prompt must not be empty")
        return value

    def output_limit(self) -> int | None:
        return self.max_tokens

    def limit_param(self) -> str:
        return "max_tokens"

    def single_prompt(self) -> str | list[int]:
        prompt = self.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], str | list):
            return prompt[0]  # a batch of one
        return prompt  # type: ignore[return-value]


R = TypeVar("R", bound=BaseModel)


def parse_request(model: type[R], data: dict[str, Any]) -> R:
    """``model`` validated from decoded JSON; ``WireError`` (400) when it does not fit."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
