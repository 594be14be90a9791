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
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from .._types import MAX_MODEL_CHARS  # the bound on model names (see there)
from .errors import WireError
from .fields import _INTEGRAL, INT32_MAX, TokenCount, TokenId, Unit, _Strict, only
from .validation import validation_error

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts
FLOAT32_TINY = 1.1754943508222875e-38  # smallest normal float32
# OpenAI takes 4 stop strings, vLLM any number; IDE plugins send more (Continue's autocomplete 9 and
# up, SillyTavern a user's own list), which were 400s here. Each is searched for in the new text every
# step (cloud_server.engine.detokenizer): 32 short ones cost microseconds; the worst case, a stop
# string longer than the answer (all text searched each step), measured ~7 ms a step at 200k
# characters against ~2 ms with 4. hybridllm's own requests (the device proxy) keep OpenAI's 4.
MAX_STOP = 32
# The engine tests every new token against the whole list: a 4 MiB body of ids ([0,0,...], two
# million of them) cost some 30 ms per token in its step, so one request slowed its whole batch.
# vLLM sets no bound; this one is far beyond any tokenizer's list of end tokens.
MAX_STOP_TOKEN_IDS = 1024
# The longest stop string. Real ones are markers and short (a turn header such as Llama 3's
# "<|start_header_id|>user<|end_header_id|>" is 40 characters, an IDE plugin's line of code a few
# hundred at most); a streamed answer holds back its last len(stop)-1 characters (they may begin a
# stop string) and the engine searches that much text per string each step, so one megabyte-long
# string froze the stream and slowed its batch. OpenAI documents no bound; this is 5x the longest.
MAX_STOP_CHARS = 1024


StopString = Annotated[str, Field(max_length=MAX_STOP_CHARS)]  # the JSON schema states the bound
Penalty = Annotated[Unit, Field(ge=-2.0, le=2.0)]  # OpenAI's presence/frequency bounds; 0 is off


class StreamOptions(_Strict):
    include_usage: bool = False
    # vLLM: usage in every chunk; not sent by these servers, so accepted only as false
    continuous_usage_stats: bool = Field(default=False, json_schema_extra={"enum": [False]})

    @field_validator("continuous_usage_stats")
    @classmethod
    def _no_continuous_usage(cls, value: bool) -> bool:
        if value:
            raise ValueError("continuous_usage_stats is not supported by this server; usage comes in "
                             "the last chunk (include_usage)")
        return value


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ResponseFormat(_Strict):
    # OpenAI's three types, each served (checked_response_format reads the schema)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


def checked_response_format(value: ResponseFormat | None) -> ResponseFormat | None:
    """A format as the grammar core takes it: a schema belongs to type json_schema, and a format
    the core refuses is a 400 naming its field (``response_format.json_schema.schema.…``)."""
    if value is None:
        return None
    if value.type != "json_schema" and value.json_schema is not None:
        raise WireError(f"response_format.json_schema is only allowed with type 'json_schema', not "
                        f"'{value.type}'.", param="response_format.json_schema")
    if value.type != "text":
        from .._structured import ResponseFormatError, parse_response_format

        try:  # compiled once: the same format asked again is the core's kept grammar
            parse_response_format(value.model_dump(exclude_none=True))
        except ResponseFormatError as exc:
            raise WireError(str(exc), param=exc.param) from None
    return value


_ANSWER_FIELDS = ("annotations", "audio", "function_call")  # an answer message's, echoed back

# "content" may be left out (or null) only by an assistant message that carried tool calls, only
# an assistant's content may hold a refusal part, and only an assistant message may carry the
# answer's own fields (the validators below refuse them elsewhere)
_CONTENT_RULE: JsonDict = {
    "if": {"properties": {"role": {"not": {"const": "assistant"}}}},
    "then": {"required": ["content"], "properties": {"content": {"not": {"anyOf": [{"type": "null"}, {
        "type": "array", "contains": {"required": ["type"], "properties": {"type": {"const": "refusal"}}},
    }]}}}, "not": {"anyOf": [{"required": [name]} for name in _ANSWER_FIELDS]}},
}


# OpenAI's assistant content part {"type": "refusal", "refusal": "..."}: read as a text part
_REFUSAL_PART: JsonDict = {
    "type": "object", "required": ["type", "refusal"], "additionalProperties": False,
    "properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}},
}


def _with_refusal_parts(schema: JsonDict) -> None:
    """``content``'s schema: a list's items are a text part or a refusal part."""
    for member in cast(list[dict[str, Any]], schema.get("anyOf", [])):
        if member.get("type") == "array":
            member["items"] = {"anyOf": [member["items"], _REFUSAL_PART]}


class ChatMessage(_Strict):
    model_config = ConfigDict(json_schema_extra=_CONTENT_RULE)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[str | list[TextPart] | None, Field(json_schema_extra=_with_refusal_parts)] = None
    name: str | None = None
    # Echoed back by clients that replay a conversation; only text is read from them.
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    # Fields of OpenAI's answer message that the official clients send back with it (the message
    # object appended to ``messages``, or its ``model_dump()``): null or as OpenAI wrote them, and
    # not read. Only an assistant turn carries them.
    function_call: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    annotations: list[dict[str, Any]] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, list):
            if info.data.get("role") == "assistant":  # a refusal part is the assistant's text
                value = [_refusal_as_text(part) for part in value]
            for part in value:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind is not None and kind != "text":
                    raise ValueError(
                        f"content parts of type {kind!r} are not supported; these models read "
                        "text only (send 'text' parts or a string)"
                    )
        return value

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a '{self.role}' message needs 'content'")
        if self.role != "assistant" and (echoed := set(_ANSWER_FIELDS) & self.model_fields_set):
            raise ValueError(f"{', '.join(repr(f) for f in sorted(echoed))} belong to assistant "
                             f"messages, not to a '{self.role}' message")
        return self

    def text(self) -> str:
        """The text of ``content``; parts joined by newlines, as ``hybridllm.prompts`` does."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


def _refusal_as_text(part: Any) -> Any:
    """OpenAI's refusal part as a text part (its words the text); any other part as it is."""
    if not isinstance(part, dict) or part.get("type") != "refusal":
        return part
    if not isinstance(part.get("refusal"), str):
        raise ValueError("a content part of type 'refusal' needs its words as a string in 'refusal'")
    # any other key stays, so the text part's own check refuses it by name
    return {**{k: v for k, v in part.items() if k != "refusal"}, "type": "text", "text": part["refusal"]}


# stream_options only with "stream": true
_STREAM_RULE: JsonDict = {
    "if": {"not": {"required": ["stream"], "properties": {"stream": {"const": True}}}},
    "then": {"properties": {"stream_options": {"type": "null"}}},
}


class SamplingRequest(_Strict):
    """Fields shared by chat and legacy completions. ``None`` means "the server's default"."""

    model_config = ConfigDict(json_schema_extra=_STREAM_RULE)

    model: Annotated[str, Field(min_length=1, max_length=MAX_MODEL_CHARS)]
    max_tokens: TokenCount | None = None
    temperature: Annotated[Unit, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[Unit, Field(ge=FLOAT32_TINY, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=INT32_MAX), _INTEGRAL] | None = None  # vLLM; -1 and 0 turn it off
    min_p: Annotated[Unit, Field(ge=0.0, le=1.0)] | None = None  # vLLM
    repetition_penalty: Annotated[Unit, Field(gt=0.0, le=10.0)] | None = None  # vLLM; 1 is off
    n: Annotated[int, Field(ge=1, le=128, json_schema_extra={"maximum": 1}), _INTEGRAL] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None  # vLLM
    seed: Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX), _INTEGRAL] | None = None
    ignore_eos: bool = False  # vLLM, for benchmarks
    # hybridllm cloud server: this request's speculative decoding ("none" turns it off)
    speculative_method: Literal["ngram", "draft", "none"] | None = None
    num_speculative_tokens: Annotated[int, Field(ge=0, le=16), _INTEGRAL] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # biases of 0 change nothing: accepted, as a penalty of 0 is (some clients send zeros)
    logit_bias: dict[str, Annotated[Unit, Field(ge=-100.0, le=100.0)]] | None = only(
        additionalProperties={"type": "number", "minimum": 0, "maximum": 0})
    user: str | None = None

    @field_validator("model", mode="before")
    @classmethod
    def _model_named(cls, value: Any) -> Any:
        # OpenAI's 400 for "model": "" (not a 404 quoting an empty name); spaces name no model either
        if isinstance(value, str) and not value.strip():
            raise WireError("you must provide a model parameter (GET /v1/models lists this server's).",
                            param="model")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _short_stops(cls, value: Any) -> Any:
        # before the type's own bound, so the 400 names "stop" and says which string and its length
        texts = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        for i, text in enumerate(texts):
            if isinstance(text, str) and len(text) > MAX_STOP_CHARS:
                where = "stop" if isinstance(value, str) else f"stop[{i}]"
                raise WireError(f"Invalid 'stop': {where} is {len(text)} characters long; a stop string "
                                f"may be at most {MAX_STOP_CHARS}.", param="stop")
        return value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError("only n=1 is supported")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value and any(value.values()):
            # its keys are token ids: the device model and the cloud number tokens differently
            raise ValueError("logit_bias is not supported by this server (its route, device or cloud, "
                             "is chosen per request, and their models' token ids differ)")
        return value

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise WireError("stream_options is only allowed when stream is true.", param="stream_options")
        return self

    def stop_list(self) -> list[str]:
        """The stop strings; an empty one stops nothing, so it is dropped."""
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


def _as_wire(check: Any, *args: Any) -> Any:
    """A library check's InvalidRequestError as the servers' 400, its ``param`` and ``code`` kept."""
    from .._exceptions import InvalidRequestError

    try:
        return check(*args)
    except InvalidRequestError as exc:
        raise WireError(str(exc), param=getattr(exc, "param", None),
                        code=getattr(exc, "code", None)) from None


def checked_tools(value: Any) -> list[dict[str, Any]]:
    """A request's ``tools`` as a chat template gets them (``{"type": "function", "function":
    {...}}``), or a 400 naming the field at fault (the library's checks, ``hybridllm._tools``)."""
    from .._tools import check_tools

    return cast(list[dict[str, Any]], _as_wire(check_tools, value))


def tool_choice_of(choice: Any, tools: list[dict[str, Any]] | None) -> tuple[str, str | None]:
    """``(mode, name)`` of a request's ``tool_choice``: "none", "auto", "required" or "named"
    (then ``name``: the function), or a 400 naming ``tool_choice``."""
    from .._tools import tool_choice_mode

    return cast(tuple[str, str | None], _as_wire(tool_choice_mode, choice, tools))


def checked_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """An assistant turn's earlier ``tool_calls``, each with ``arguments`` as a JSON text, or a
    400 naming the call at fault."""
    from .._tools import check_calls

    return cast(list[dict[str, Any]], _as_wire(check_calls, value, where))


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
