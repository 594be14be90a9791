"""A chat request's messages: :class:`ChatMessage` and its text parts, as OpenAI's clients send them.

Content is text only (a string or ``text`` parts); an assistant turn may carry OpenAI's refusal
part and the answer's own fields that the official clients echo back, read as its text or not read.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.config import JsonDict

from .fields import _Strict


class TextPart(_Strict):
    type: Literal["text"]
    text: str


_ANSWER_FIELDS = ("annotations", "audio", "function_call")  # an answer message's, echoed back

# "content" may be left out (or null) only by an assistant message that carried tool calls, only
# an assistant's content may hold a refusal part, and only an assistant message may carry the
# answer's own fields (the validators below refuse them elsewhere)
_CONTENT_RULE: JsonDict = {
    "if": {"properties": {"role": {"not": {"const": "assistant"}}}},
    "then": {
        "required": ["content"],
        "properties": {
            "content": {
                "not": {
                    "anyOf": [
                        {"type": "null"},
                        {
                            "type": "array",
                            "contains": {"required": ["type"], "properties": {"type": {"const": "refusal"}}},
                        },
                    ]
                }
            }
        },
        "not": {"anyOf": [{"required": [name]} for name in _ANSWER_FIELDS]},
    },
}


# OpenAI's assistant content part {"type": "refusal", "refusal": "..."}: read as a text part
_REFUSAL_PART: JsonDict = {
    "type": "object",
    "required": ["type", "refusal"],
    "additionalProperties": False,
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
            raise ValueError(
                f"{', '.join(repr(f) for f in sorted(echoed))} belong to assistant "
                f"messages, not to a '{self.role}' message"
            )
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
