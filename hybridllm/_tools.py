"""OpenAI function calling, the parts the library and both servers share: a request's ``tools``,
``tool_choice`` and a conversation's earlier calls checked (each error an InvalidRequestError
naming its field in ``param``), and an answer's calls read back, whole or streamed.

Light on purpose (no pydantic): ``import hybridllm`` stays the light client's. The cloud server
(``cloud_server.api.tools``) and ``hybridllm serve`` turn these errors into their 400s. A model's
text answer is read as calls in :mod:`hybridllm._tool_answers`, by the plan (and the grammar that
holds the answer) of :mod:`hybridllm._tool_plan`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ._exceptions import InvalidRequestError
from ._types import USER_TEXT, private_repr

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
MAX_TOOLS = 128  # OpenAI's limit on a request's tools
CHOICES = ("none", "auto", "required")
_TOOL_KEYS = {"type", "function"}
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}
_CALL_SHAPE = ('{"id": "call_1", "type": "function", "function": {"name": "get_weather", '
               '"arguments": "{\\"city\\": \\"Paris\\"}"}}')


def refused(message: str, param: str, code: str | None = None) -> InvalidRequestError:
    """A request error naming its field (``param``, as OpenAI's 400 does) and, where OpenAI has
    one, its ``code``."""
    error = InvalidRequestError(message)
    error.param = param  # type: ignore[attr-defined]
    error.code = code  # type: ignore[attr-defined]
    return error


def check_tools(value: Any) -> list[dict[str, Any]]:
    """The request's ``tools`` as a chat template gets them (``{"type": "function", "function":
    {...}}``, a null field left out), or an InvalidRequestError naming the field at fault."""
    if not isinstance(value, list | tuple):
        raise refused("Invalid 'tools': expected a list of {\"type\": \"function\", \"function\": "
                      "{\"name\": ..., \"parameters\": {...}}} objects.", "tools")
    if not value:  # OpenAI's 400: leave tools out rather than send none
        raise refused("Invalid 'tools': empty array. Expected an array with minimum length 1, but got "
                      "an empty array instead.", "tools", "empty_array")
    if len(value) > MAX_TOOLS:
        raise refused(f"Invalid 'tools': array too long. Expected an array with maximum length "
                      f"{MAX_TOOLS}, but got an array with length {len(value)} instead.", "tools",
                      "array_above_max_length")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise refused(f"Invalid '{where}': expected an object such as {{\"type\": \"function\", "
                          "\"function\": {\"name\": \"get_weather\", \"parameters\": {...}}}.", where)
        if tool.get("type") != "function":
            raise refused(f"Invalid '{where}.type': {tool.get('type')!r}; only 'function' tools are "
                          "supported.", f"{where}.type")
        extra = sorted(set(tool) - _TOOL_KEYS)
        if extra:
            raise refused(f"Unrecognized field '{where}.{extra[0]}'.", f"{where}.{extra[0]}")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise refused(f"Missing required parameter: '{where}.function'.", f"{where}.function")
        extra = sorted(set(fn) - _FUNCTION_KEYS)
        if extra:
            at = f"{where}.function.{extra[0]}"
            raise refused(f"Unrecognized field '{at}'.", at)
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise refused(f"Invalid '{where}.function.name': {str(name)[:80]!r} does not match "
                          "'^[a-zA-Z0-9_-]{1,64}$'.", f"{where}.function.name")
        if name in seen:
            raise refused(f"Invalid '{where}.function.name': {name!r} names two tools; each needs its "
                          "own name.", f"{where}.function.name")
        seen.add(name)
        for key, kind, check in (("description", "a string", str), ("parameters", "a JSON schema (an "
                                 "object)", dict), ("strict", "a boolean", bool)):
            if fn.get(key) is not None and not isinstance(fn[key], check):
                at = f"{where}.function.{key}"
                raise refused(f"Invalid '{at}': expected {kind}.", at)
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    try:  # what goes to a server must be JSON (a set, NaN or an object inside a schema is not)
        json.dumps(out, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise refused(f"Invalid 'tools': they must hold JSON values only ({exc}).", "tools") from None
    return out


def tool_choice_mode(choice: Any, tools: list[dict[str, Any]] | None) -> tuple[str, str | None]:
    """``(mode, name)`` of a request's ``tool_choice``: mode "none", "auto" (the default with
    tools), "required" or "named" (then ``name``: the function, one of ``tools``). Without tools,
    only a missing choice or "none" is taken, as OpenAI's API takes it."""
    if not tools:
        if choice not in (None, "none"):
            raise refused("tool_choice is only allowed when tools are specified.", "tool_choice")
        return "none", None
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise refused(f"Invalid 'tool_choice': {choice[:40]!r}; expected 'none', 'auto', 'required' "
                          "or {\"type\": \"function\", \"function\": {\"name\": \"...\"}}.", "tool_choice")
        return choice, None
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or set(choice) != {"type", "function"} or set(fn or ()) != {"name"}:
        raise refused("Invalid 'tool_choice': expected 'none', 'auto', 'required' or "
                      "{\"type\": \"function\", \"function\": {\"name\": \"...\"}}.", "tool_choice")
    names = [t["function"]["name"] for t in tools]
    if name not in names:
        raise refused(f"Invalid 'tool_choice': no function named {name[:80]!r} in 'tools' (they are "
                      f"{', '.join(names)}).", "tool_choice")
    return "named", name


def check_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """An assistant turn's ``tool_calls`` (OpenAI's shape, as its answer gave them), each as
    ``{"id", "type": "function", "function": {"name", "arguments"}}`` with ``arguments`` a JSON
    text (an object given there is written as one); an InvalidRequestError naming the call at
    fault otherwise."""
    if not isinstance(value, list | tuple):
        raise refused(f"Invalid '{where}': expected a list of calls such as {_CALL_SHAPE}.", where)
    out = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise refused(f"Invalid '{at}': expected a call such as {_CALL_SHAPE}.", at)
        if call.get("type", "function") != "function":
            raise refused(f"Invalid '{at}.type': {call.get('type')!r}; only 'function' calls are "
                          "supported.", f"{at}.type")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise refused(f"Invalid '{at}.id': expected a string.", f"{at}.id")
        args = fn.get("arguments")
        if args is None:
            args = "{}"
        elif not isinstance(args, str):
            try:  # an object, as a hand-written conversation may give it: its JSON text
                args = json.dumps(args, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError):
                raise refused(f"Invalid '{at}.function.arguments': expected a JSON text.",
                              f"{at}.function.arguments") from None
        out.append({"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


def uses_tools(messages: list[dict[str, Any]], tools: Any) -> bool:
    """A request that gives tools, or whose conversation holds calls or their results: its answer
    depends on what the tools did, so the semantic cache neither serves nor keeps it."""
    return bool(tools) or has_tool_turns(messages)


def calls_tools(tools: Any, tool_choice: Any, messages: list[dict[str, Any]]) -> bool:
    """Whether the answer needs a model that reads tools: tools given that it may call (a
    ``tool_choice`` not "none"), or, with tools given, a conversation holding calls or their results,
    which only a template with a tool format writes out. Tools with "none" and no such turns are
    shown to no model: any model answers them (the library's routing and the proxy's check)."""
    if tools is None:
        return False
    if tools and tool_choice_mode(tool_choice, list(tools))[0] != "none":
        return True
    return has_tool_turns(messages)


def has_tool_turns(messages: list[dict[str, Any]]) -> bool:
    """The conversation holds calls (an assistant's ``tool_calls``) or their results (``tool``)."""
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


@dataclass(frozen=True)
class Function:
    """The function a tool call names and its arguments, a JSON text as the model wrote it (read
    it with ``json.loads``; a model can write JSON that does not fit the tool's schema unless
    ``tool_choice`` forced the call). In repr by its length only."""

    name: str
    arguments: str = field(metadata=USER_TEXT)

    __repr__ = private_repr


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool in an answer (``Completion.tool_calls``), shaped as OpenAI's: run the
    function, then send its result back as ``{"role": "tool", "tool_call_id": call.id, "content":
    ...}`` after the assistant turn (``completion.message()``)."""

    id: str
    function: Function
    type: str = "function"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type,
                "function": {"name": self.function.name, "arguments": self.function.arguments}}

    def as_delta(self, index: int) -> ToolCallDelta:
        """The whole call as one stream piece, at ``index`` among the answer's calls."""
        return ToolCallDelta(index, self.id, self.function.name, self.function.arguments)


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed call (``Chunk.tool_calls``), as OpenAI streams them: a call's first
    piece has its ``index`` (its place among the answer's calls), ``id`` and ``name``; later pieces
    of the same ``index`` carry more of its ``arguments``."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = field(default="", metadata=USER_TEXT)

    __repr__ = private_repr

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's chunk form (``choices[0].delta.tool_calls[i]``)."""
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out["id"], out["type"] = self.id, "function"
        fn: dict[str, Any] = {"arguments": self.arguments}
        if self.name is not None:
            fn["name"] = self.name
        out["function"] = fn
        return out


class CallsReader:
    """An answer's tool calls, from a cloud's chunks: each chunk's ``delta.tool_calls`` fed in
    (:meth:`feed`: the pieces, checked), the whole calls at the end (:meth:`calls`). A piece
    that is not OpenAI's shape is a ValueError (the stream is malformed)."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, Any]] = {}

    def __bool__(self) -> bool:
        return bool(self._calls)

    def feed(self, pieces: Any) -> list[ToolCallDelta]:
        if not isinstance(pieces, list):
            raise ValueError(f"tool_calls is {type(pieces).__name__}, not a list")
        out = []
        for piece in pieces:
            if not isinstance(piece, dict):
                raise ValueError(f"a tool call delta is {type(piece).__name__}, not an object")
            # OpenAI's chunks number every piece; a whole call in a server's one piece may lack it
            index = piece.get("index", len(self._calls) if piece.get("id") not in (None, "") else None)
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise ValueError(f"a tool call delta has index {index!r}")
            fn = piece.get("function") or {}
            if not isinstance(fn, dict):
                raise ValueError(f"a tool call's function is {type(fn).__name__}, not an object")
            name, args, call_id = fn.get("name"), fn.get("arguments") or "", piece.get("id")
            for what, v in (("name", name), ("id", call_id)):
                if v is not None and not isinstance(v, str):
                    raise ValueError(f"a tool call's {what} is {type(v).__name__}, not text")
            if not isinstance(args, str):
                raise ValueError(f"a tool call's arguments are {type(args).__name__}, not text")
            call = self._calls.setdefault(index, {"id": None, "name": None, "arguments": ""})
            # a server that repeats the id or name in each piece (some do): taken once
            new_id = call_id if call_id and call["id"] is None else None
            new_name = name if name and call["name"] is None else None
            call["id"] = call["id"] or call_id or None
            call["name"] = call["name"] or name or None
            call["arguments"] += args
            if new_id or new_name or args:
                out.append(ToolCallDelta(index, new_id, new_name, args))
        return out

    def calls(self) -> list[ToolCall]:
        """The whole calls, in index order; a call whose name never came is a ValueError."""
        out = []
        for index in sorted(self._calls):
            call = self._calls[index]
            if not call["name"]:
                raise ValueError(f"tool call {index} has no function name")
            out.append(ToolCall(call["id"] or f"call_{index}", Function(call["name"], call["arguments"])))
        return out

