"""Response and chunk shapes of the OpenAI wire format, SSE framing, and their OpenAPI models.

Responses are built as plain dicts (one per token when streaming; no validation on that path);
the pydantic models below only describe them in the servers' OpenAPI documents, and the tests
check real responses against those documents.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from .._finite import finite_json

DONE = "data: [DONE]\n\n"


def sse_event(payload: dict[str, Any]) -> str:
    """One server-sent event. ``ensure_ascii`` keeps the frame ASCII whatever the text holds. A
    NaN or infinity (a replica's energy figure, an unfloored logprob) goes out as null, as in the
    proxy's finished answers (``finite_json``): a bare ``NaN`` strict JSON clients refuse."""
    return f"data: {finite_json(payload, separators=(',', ':'))}\n\n"


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return usage


def chat_choice(text: str | None, finish_reason: str, logprobs: dict[str, Any] | None = None,
                index: int = 0, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One entry of a chat answer's ``choices`` (``index``: which of the request's ``n``);
    ``tool_calls``: the functions the answer calls (the cloud server's; ``text`` then may be None)."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }


def text_choice(text: str, finish_reason: str, logprobs: dict[str, Any] | None = None,
                index: int = 0) -> dict[str, Any]:
    """One entry of a legacy completion's ``choices``."""
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_completion(
    *,
    id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    usage: dict[str, Any],
    logprobs: dict[str, Any] | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    # an answer that only calls tools has null content, as OpenAI's
    choice = chat_choice(text or None if tool_calls else text, finish_reason, logprobs, tool_calls=tool_calls)
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [choice],
        "usage": usage,
        **extra,
    }


def text_completion(
    *,
    id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    usage: dict[str, Any],
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = text_choice(text, finish_reason, logprobs)
    return {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [choice],
        "usage": usage,
    }


class ChunkWriter:
    """The SSE events of one streamed answer: ``role()`` first (chat), ``text()`` per delta,
    ``finish()``, ``usage()`` when asked for, then ``DONE``. ``index``: the choice an event belongs
    to (the cloud server's ``n`` > 1 interleaves its choices' events)."""

    def __init__(self, *, id: str, created: int, model: str, chat: bool, include_usage: bool) -> None:
        self.chat = chat
        self.include_usage = include_usage
        self.base: dict[str, Any] = {
            "id": id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": None,
        }

    def _event(self, text: str | None, finish: str | None, role: bool = False,
               logprobs: dict[str, Any] | None = None, index: int = 0,
               tool_calls: list[dict[str, Any]] | None = None, **extra: Any) -> str:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            if tool_calls is not None:
                delta["tool_calls"] = tool_calls
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        usage_null = {"usage": None} if self.include_usage else {}
        return sse_event({**self.base, "choices": [choice], **usage_null, **extra})

    def role(self, index: int = 0) -> str:
        return self._event("", None, role=True, index=index)

    def text(self, text: str, logprobs: dict[str, Any] | None = None, index: int = 0) -> str:
        """A text delta; ``logprobs``: the entries of the tokens it carries (cloud server only)."""
        return self._event(text, None, logprobs=logprobs, index=index)

    def tool_call(self, call: dict[str, Any], index: int = 0) -> str:
        """One tool-call delta of the answer (its ``index``: the call's place among the answer's
        calls): a whole call, or a call's start or more of its arguments (cloud server only)."""
        return self._event(None, None, index=index, tool_calls=[call])

    def finish(self, reason: str, index: int = 0, **extra: Any) -> str:
        return self._event(None, reason, index=index, **extra)

    def usage(self, usage: dict[str, Any]) -> str:
        return sse_event({**self.base, "choices": [], "usage": usage})


def error_event(body: dict[str, Any]) -> str:
    """An error reported in-band after the headers are sent (as OpenAI does), then the end."""
    return sse_event(body) + DONE


# -- models for the OpenAPI documents ------------------------------------------------------------


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | int | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class PromptTokensDetails(_Doc):
    cached_tokens: int


class Usage(_Doc):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class FunctionCall(_Doc):
    name: str
    arguments: str  # a JSON text


class ToolCall(_Doc):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(_Doc):
    role: Literal["assistant"]
    content: str | None  # None: the answer only calls tools
    tool_calls: list[ToolCall] | None = None


class ChatChoice(_Doc):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None  # {"content": [...]} when asked for (cloud server)
    finish_reason: str


class ChatCompletion(_Doc):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class TextChoice(_Doc):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None  # tokens, token_logprobs, top_logprobs, text_offset
    finish_reason: str


class TextCompletion(_Doc):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage


class ModelCard(_Doc):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(_Doc):
    object: Literal["list"]
    data: list[ModelCard]


class Health(_Doc):
    status: str
