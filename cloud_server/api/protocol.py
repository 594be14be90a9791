"""Request models of the OpenAI wire format: the shared ones in ``hybridllm.wire``.

The cloud server and the local proxy accept the same bodies with the same checks (strict types,
unknown fields refused, unsupported features a 400 naming the parameter); see
``hybridllm/wire/requests.py`` for what is accepted and why. One difference: this server reports
token log-probabilities (``CloudChatCompletionRequest``, ``CloudCompletionRequest``), which the
proxy refuses, since its device route cannot always give them; and it serves ``logit_bias`` (the
engine's sampler applies it), which the proxy accepts at its neutral value only (token ids of the
cloud's tokenizer mean nothing to a device model). ``presence_penalty`` and ``frequency_penalty``
are the shared models' own (both servers serve them, with the same bounds). And it serves
OpenAI's structured output, ``response_format`` of type ``json_object`` or ``json_schema``, on both
endpoints (as vLLM does): the format is parsed here by the grammar core (``hybridllm._structured``),
so a schema it cannot serve is a 400 naming the schema's field. vLLM's own fields are served as
well, so a vLLM client's requests run unchanged: ``structured_outputs`` (``{"json": schema}``,
``{"regex": pattern}`` or ``{"choice": [strings]}``) and the older ``guided_json``,
``guided_regex`` and ``guided_choice``, one of them at most, and not beside a ``response_format``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, PrivateAttr, field_validator, model_validator

from cloud_server.engine.sampling_params import MAX_LOGIT_BIAS
from hybridllm._types import MAX_MODEL_CHARS
from hybridllm.wire.errors import WireError
from hybridllm.wire.fields import _INTEGRAL, INT32_MAX, TokenId, Unit, _Strict
from hybridllm.wire.requests import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ResponseFormat,
    SamplingRequest,
    StreamOptions,
    TextPart,
    ToolsChatRequest,
    _as_wire,
    checked_response_format,
    parse_request,
)
from hybridllm.wire.vllm_formats import VllmFormatFields, vllm_field, vllm_grammar

from .tools import ToolPlan, template_messages, tool_choice_of

# OpenAI's: token ids (as JSON keys, strings) to biases in -100..100, at most 300 of them
LogitBias = Annotated[dict[str, Annotated[Unit, Field(ge=-100.0, le=100.0)]],
                      Field(json_schema_extra={"maxProperties": MAX_LOGIT_BIAS,
                                               "propertyNames": {"pattern": "^[0-9]+$"}})]


def _bias_keys(value: dict[str, float] | None) -> dict[str, float] | None:
    """logit_bias's keys are token ids: a 400 naming it for a key that is not one, or past 300 keys
    (which ids the vocabulary holds is checked where the request is prepared)."""
    if value is None:
        return value
    if len(value) > MAX_LOGIT_BIAS:
        raise WireError(f"Invalid 'logit_bias': {len(value)} token ids; at most {MAX_LOGIT_BIAS} may be "
                        "biased.", param="logit_bias")
    for key in value:
        if not (key.isascii() and key.isdigit()) or int(key) > INT32_MAX:
            raise WireError(f"Invalid key in 'logit_bias': {key[:40]!r} is not a token id (an integer "
                            "from 0).", param="logit_bias")
    return value


def _grammar_of(value: ResponseFormat | None) -> Any:
    """The format's Grammar (None for text); a format the core refuses is a 400 with its field."""
    if value is None:
        return None
    from hybridllm._structured import ResponseFormatError, parse_response_format

    try:
        return parse_response_format(value.model_dump(exclude_none=True))
    except ResponseFormatError as exc:
        raise WireError(str(exc), param=exc.param or "response_format") from None


class _StructuredMixin:
    """``response_format`` (or vLLM's fields) parsed once, at validation; ``response_grammar()``
    hands it over."""

    _grammar: Any = PrivateAttr(default=None)

    def response_grammar(self) -> Any:
        return self._grammar

    def _set_grammar(self) -> None:
        self._grammar = vllm_grammar(self) or _grammar_of(self.response_format)  # type: ignore[attr-defined]


class CloudChatCompletionRequest(_StructuredMixin, VllmFormatFields, ToolsChatRequest):
    """A chat body with OpenAI's ``logprobs`` (bool) and ``top_logprobs`` (0..20) served."""

    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20), _INTEGRAL] | None = None
    logit_bias: LogitBias | None = None

    # function calling (cloud_server/api/tools.py; the fields are ToolsChatRequest's)
    _tool_plan: ToolPlan | None = PrivateAttr(default=None)

    # same names as the shared model's refusing validators: these replace them (the penalties and
    # response_format are the shared model's own: hybridllm/wire/requests.py)
    @model_validator(mode="after")
    def _parse_format(self) -> CloudChatCompletionRequest:
        self._set_grammar()
        self._plan_tools()
        return self

    def _plan_tools(self) -> None:
        """How the answer is read (``tool_plan``); a forced call's grammar becomes the request's."""
        mode, name = tool_choice_of(self.tool_choice, self.tools)
        if mode == "none" or self.tools is None:
            return
        if self._grammar is not None:
            given = vllm_field(self) or "response_format"
            raise WireError(f"tools cannot be combined with {given} (a call's arguments follow the "
                            "tool's own parameters schema): send one, or tool_choice 'none'.", param=given)
        if self.logprobs:
            raise WireError("logprobs are not served beside tools: send tool_choice 'none' or leave "
                            "logprobs out.", param="logprobs")
        plan = ToolPlan(self.tools, mode, name, self.parallel_tool_calls is not False)
        self._grammar = _as_wire(plan.grammar)  # a schema the grammar cannot serve: a 400 naming it
        self._tool_plan = plan

    def tool_plan(self) -> ToolPlan | None:
        """The request's tools and how its answer is read; None: a text answer, no tools."""
        return self._tool_plan

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: bool | None) -> bool | None:
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        return _bias_keys(value)

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
        template_messages(self.messages, out)  # earlier calls and results, for the template
        return out

    def num_logprobs(self) -> int | None:
        """None: no log-probabilities; N: each token's and its N most likely alternatives."""
        return (self.top_logprobs or 0) if self.logprobs else None

    # n choices, each its own engine request (serving.py); the proxy's model refuses n > 1
    n: Annotated[int, Field(ge=1, le=128), _INTEGRAL] = 1

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        return value


class CloudCompletionRequest(_StructuredMixin, VllmFormatFields, CompletionRequest):
    """A legacy completions body with ``logprobs`` (0..5 alternatives per token) served, and
    ``response_format`` and ``structured_outputs`` (vLLM's extensions of this endpoint)."""

    logprobs: Annotated[int, Field(ge=0, le=5), _INTEGRAL] | None = None
    logit_bias: LogitBias | None = None
    response_format: ResponseFormat | None = None

    @field_validator("response_format")
    @classmethod
    def _format(cls, value: ResponseFormat | None) -> ResponseFormat | None:
        return checked_response_format(value)

    @model_validator(mode="after")
    def _parse_format(self) -> CloudCompletionRequest:
        self._set_grammar()
        return self

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: int | None) -> int | None:
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        return _bias_keys(value)

    def num_logprobs(self) -> int | None:
        return self.logprobs

    # n choices, each its own engine request (serving.py); the proxy's model refuses n > 1
    n: Annotated[int, Field(ge=1, le=128), _INTEGRAL] = 1

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        return value


class TokenizeRequest(_Strict):
    """vLLM's ``/tokenize`` body: a ``prompt`` (tokenized as ``/v1/completions`` reads it) or chat
    ``messages`` (and ``tools``), rendered and tokenized as ``/v1/chat/completions`` does, so its
    ``count`` is that request's ``usage.prompt_tokens``."""

    model: Annotated[str, Field(min_length=1, max_length=MAX_MODEL_CHARS)] | None = None
    prompt: str | None = None
    messages: Annotated[list[dict[str, Any]], Field(min_length=1)] | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = True  # a prompt's BOS, where the model adds one
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise WireError("Send exactly one of 'prompt' and 'messages'.",
                            param="messages" if self.messages is not None else "prompt")
        if self.tools is not None and self.messages is None:
            raise WireError("'tools' go with 'messages' (a chat's prompt), not with a 'prompt'.",
                            param="tools")
        return self

    def chat_request(self, model: str) -> CloudChatCompletionRequest:
        """The chat request whose prompt this counts (its messages and tools checked as there)."""
        body: dict[str, Any] = {"model": self.model or model, "messages": self.messages}
        if self.tools is not None:
            body["tools"] = self.tools
        return parse_request(CloudChatCompletionRequest, body)


class DetokenizeRequest(_Strict):
    """vLLM's ``/detokenize`` body: token ids of this model's vocabulary."""

    model: Annotated[str, Field(min_length=1, max_length=MAX_MODEL_CHARS)] | None = None
    tokens: list[TokenId]


__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CloudChatCompletionRequest",
    "CloudCompletionRequest",
    "CompletionRequest",
    "DetokenizeRequest",
    "SamplingRequest",
    "StreamOptions",
    "TextPart",
    "TokenizeRequest",
    "parse_request",
]
