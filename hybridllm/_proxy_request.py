"""The proxy's chat request: the wire format's chat request plus its own ``hybridllm`` routing options."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from ._tools import calls_tools
from ._types import (
    MAX_STOP,  # the library's bound (OpenAI's 4), not the wire's 32
    )
from .wire import WireError
from .wire.requests import _STREAM_RULE, ToolsChatRequest, checked_calls, tool_choice_of
from .wire.vllm_formats import VllmFormatFields, vllm_field, vllm_grammar


class HybridOptions(BaseModel):
    """Routing options of one request (the proxy's own extension of the wire format)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    route: Literal["edge", "cloud"] | None = None
    cache: bool | None = None
    cascade: bool | None = None
    # "" is no namespace (the client refuses it): a 400 naming hybridllm.namespace, and so documented
    namespace: Annotated[str, Field(min_length=1)] | None = None


# a message's content may not be an empty list of parts, and a user turn needs text (the checks of
# ProxyChatRequest._no_empty_turns; "\S": some character that is not white space)
_TEXT = {"type": "string", "pattern": "\\S"}
_TURN_RULE: dict[str, Any] = {
    "properties": {"content": {"not": {"type": "array", "maxItems": 0}}},
    "if": {"properties": {"role": {"const": "user"}}, "required": ["role"]},
    "then": {"properties": {"content": {"anyOf": [
        _TEXT, {"type": "array", "contains": {"properties": {"text": _TEXT}, "required": ["text"]}}]}}},
}


def _schema_extra(schema: dict[str, Any]) -> None:
    schema.update(_STREAM_RULE)
    messages = schema["properties"]["messages"]
    # HybridLLM answers a user: a conversation needs at least one user turn
    messages["contains"] = {"properties": {"role": {"const": "user"}}}
    messages["items"] = {"allOf": [messages["items"], _TURN_RULE]}
    # the wire's list takes 32 stop strings (the cloud server's); this server passes them to
    # HybridLLM, which takes OpenAI's 4 (its cloud route may be OpenAI): the document says so
    for alt in schema["properties"]["stop"]["anyOf"]:
        if alt.get("type") == "array":
            alt["maxItems"] = MAX_STOP


class ProxyChatRequest(VllmFormatFields, ToolsChatRequest):
    model_config = ConfigDict(json_schema_extra=_schema_extra)
    hybridllm: HybridOptions | None = None
    # (tools: passed to the cloud model, the only one that calls them; README, Function calling)
    # vLLM's structured_outputs / guided_*, as the client's format (the grammar's own form)
    _vllm_format: dict[str, Any] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _read_vllm_format(self) -> ProxyChatRequest:
        """vLLM's fields checked here (a 400 naming the field), as the cloud server checks them."""
        grammar = vllm_grammar(self)
        self._vllm_format = None if grammar is None else grammar.response_format
        return self

    @model_validator(mode="after")
    def _tools_fit(self) -> ProxyChatRequest:
        """``tool_choice`` names a given tool; forced calls follow their own schema, not a format;
        and each earlier call in the conversation is whole (a 400 naming it)."""
        mode, _ = tool_choice_of(self.tool_choice, self.tools)
        formatted = self.response_format is not None and self.response_format.type != "text"
        given = vllm_field(self) or ("response_format" if formatted else None)
        if mode != "none" and given is not None:
            raise WireError(f"tools cannot be combined with {given} (a call's arguments follow "
                            "the tool's own parameters schema): send one, or tool_choice 'none'.",
                            param=given)
        for i, m in enumerate(self.messages):
            if m.role == "assistant" and m.tool_calls:
                checked_calls(m.tool_calls, f"messages[{i}].tool_calls")
        return self
    @model_validator(mode="after")
    def _needs_a_user_turn(self) -> ProxyChatRequest:
        if not any(m.role == "user" for m in self.messages):
            raise WireError("The messages hold no user turn: add {'role': 'user', 'content': ...}.",
                            param="messages")
        return self

    @model_validator(mode="after")
    def _no_empty_turns(self) -> ProxyChatRequest:
        """As the library refuses ``chat("")``: a user turn without text, or content that is an empty
        list of parts (which OpenAI refuses too), is a 400 naming the message."""
        for i, m in enumerate(self.messages):
            where = f"messages[{i}].content"
            if isinstance(m.content, list) and not m.content:
                raise WireError(f"{where} is an empty list of content parts: give at least one "
                                "{'type': 'text', 'text': '...'}, or a string.", param=where)
            if m.role == "user" and not m.text().strip():
                raise WireError(f"messages[{i}] is a user turn without text: write the question in "
                                f"its content, or leave the message out.", param=where)
        return self

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        # refused here, naming "stop" as OpenAI's 400 does; past the door, HybridLLM's own refusal
        # was a 400 with no param, and the document allowed 32. Empty strings stop nothing and are
        # dropped (stop_list), as before: they do not count.
        given = len([s for s in value if s]) if isinstance(value, list) else 0
        if given > MAX_STOP:
            raise WireError(f"Invalid 'stop': {given} stop strings; this server takes at most "
                            f"{MAX_STOP}, as OpenAI does.", param="stop")
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _no_stop_ids(cls, value: list[int] | None) -> list[int] | None:
        if value:
            raise ValueError("stop_token_ids are not supported by this server; use 'stop'")
        return value

    @field_validator("ignore_eos")
    @classmethod
    def _no_ignore_eos(cls, value: bool) -> bool:
        if value:
            raise ValueError("ignore_eos is not supported by this server")
        return value

    def chat_messages(self) -> list[dict[str, Any]]:
        """The wire's messages, with what ties calls and results together: an assistant turn's
        ``tool_calls`` and a tool turn's ``tool_call_id`` (the cloud model reads them)."""
        out: list[dict[str, Any]] = list(super().chat_messages())
        for m, turn in zip(self.messages, out, strict=True):
            if m.role == "assistant" and m.tool_calls:
                turn["tool_calls"] = m.tool_calls
            if m.role == "tool" and m.tool_call_id is not None:
                turn["tool_call_id"] = m.tool_call_id
        return out

    def calls_tools(self, messages: list[dict[str, Any]]) -> bool:
        """Whether the answer needs a model that reads tools (``Request.calls_tools``, the library's
        test): tools that the answer may call (``tool_choice`` not "none"), or a conversation (its
        ``chat_messages()``) holding calls or their results. Tools with "none" (an agent's last turn,
        for a text answer) are shown to no model: any model answers them."""
        return calls_tools(self.tools, self.tool_choice, messages)

    def chat_options(self) -> dict[str, Any]:
        """Keyword options for ``HybridLLM.chat``: sampling, then routing."""
        opts: dict[str, Any] = {
            "max_tokens": self.output_limit(),
            "temperature": self.temperature,
            "top_p": self.top_p,
            # the wire's -1 ("off", vLLM) is the client's 0
            "top_k": None if self.top_k is None else max(self.top_k, 0),
            "min_p": self.min_p,
            "repeat_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "seed": self.seed,
            "stop": tuple(self.stop_list()) if self.stop is not None else None,
            "response_format": (self.response_format.model_dump(exclude_none=True)
                                if self.response_format is not None and self.response_format.type != "text"
                                else self._vllm_format),
        }
        if self.tools is not None:
            opts.update(tools=self.tools, tool_choice=self.tool_choice,
                        parallel_tool_calls=self.parallel_tool_calls)
        opts = {k: v for k, v in opts.items() if v is not None}
        if self.hybridllm is not None:
            opts.update(self.hybridllm.model_dump(exclude_none=True))
        return opts
