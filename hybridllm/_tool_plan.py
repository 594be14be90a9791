"""A request's tools and its ``tool_choice`` as a plan: how its answer is read as calls and
which grammar holds it.

- ``ToolPlan``: "required" (an array of ``{"name", "arguments"}``) and a named function (its
  arguments alone) are held to a grammar from the start; "auto" to ``ToolCallsGrammar``, which
  holds each call the answer makes to its tool's schema and leaves its text free.
- ``plan_of(params)``: the plan of a ``GenerationParams`` (None: a text answer).

The answer itself is read by ``hybridllm._tool_answers.ToolCallReader`` (``ToolPlan.reader()``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._exceptions import InvalidRequestError
from ._tools import refused, tool_choice_mode

if TYPE_CHECKING:
    from ._tool_answers import ToolCallReader

_SCHEMA_PATH = "response_format.json_schema.schema"


@dataclass(frozen=True)
class ToolPlan:
    """A request's tools and how its answer is read: ``mode`` "auto", "required" or "named"."""

    tools: list[dict[str, Any]]
    mode: str
    name: str | None = None
    parallel: bool = True

    def grammar(self) -> Any:
        """The grammar a forced call is constrained by, a 400 naming the tool's ``parameters``
        when the grammar core cannot serve its schema; for "auto", the hold of the calls the
        answer may make (``ToolCallsGrammar``: free text, each call held to its tool's schema),
        or None when a tool's schema cannot be served (the calls are then read as written)."""
        from hybridllm._structured import ResponseFormatError, ToolCallsGrammar, parse_response_format

        if self.mode == "auto":
            try:
                calls, defs = self._call_items()
                call = parse_response_format({"type": "json_schema", "json_schema": {
                    "name": "tool_call", "schema": {"anyOf": calls, **defs}}})
            except (ResponseFormatError, InvalidRequestError):
                return None
            return ToolCallsGrammar(call, [t["function"]["name"] for t in self.tools])
        if self.mode == "named":
            index = next(i for i, t in enumerate(self.tools) if t["function"]["name"] == self.name)
            schema = _parameters(self.tools[index])
            where = [(re.escape(_SCHEMA_PATH), f"tools[{index}].function.parameters")]
        else:
            schema = self._calls_schema()
            where = [(re.escape(_SCHEMA_PATH) + r"\.items\.anyOf\[(\d+)\]\.properties\.arguments",
                      r"tools[\1].function.parameters"), (re.escape(_SCHEMA_PATH), "tools")]
        try:
            return parse_response_format({"type": "json_schema",
                                          "json_schema": {"name": "tool_call", "schema": schema}})
        except ResponseFormatError as exc:
            message, param = exc.message, exc.param
            for pattern, name in where:  # the field as the request names it
                message, param = re.sub(pattern, name, message), re.sub(pattern, name, param)
            raise refused(f"A tool's parameters cannot be served as a grammar: {message}", param) from None

    def _calls_schema(self) -> dict[str, Any]:
        """The answer of "required": an array of calls (``_call_items``)."""
        calls, defs = self._call_items()
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not self.parallel:
            schema["maxItems"] = 1
        return {**schema, **defs}

    def _call_items(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """(a call's schema per tool: its name and its arguments, the root's ``$defs``). Each
        tool's ``$defs`` move to the root, where ``$ref`` finds them (two tools defining one name
        differently are a 400)."""
        defs: dict[str, Any] = {}
        calls = []
        for i, tool in enumerate(self.tools):
            params = dict(_parameters(tool))
            for key in ("$defs", "definitions"):
                for name, value in (params.pop(key, None) or {}).items():
                    if defs.setdefault(f"{key}/{name}", value) != value:
                        at = f"tools[{i}].function.parameters.{key}.{name}"
                        raise refused(f"Invalid '{at}': another tool defines it differently; give it "
                                      "another name.", at)
            calls.append({"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                          "properties": {"name": {"const": tool["function"]["name"]}, "arguments": params}})
        root: dict[str, Any] = {}
        for path, value in defs.items():
            key, name = path.split("/", 1)
            root.setdefault(key, {})[name] = value
        return calls, root

    def reader(self) -> ToolCallReader:
        from ._tool_answers import ToolCallReader

        return ToolCallReader(self)


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    # OpenAI: a function without parameters takes none (an empty object)
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def plan_of(params: Any) -> ToolPlan | None:
    """How a request's answer is read as calls (``GenerationParams``'s tools and tool_choice);
    None without tools or with tool_choice "none" (a text answer; the tools are not shown)."""
    tools = getattr(params, "tools", None)
    if not tools:
        return None
    mode, name = tool_choice_mode(getattr(params, "tool_choice", None), list(tools))
    if mode == "none":
        return None
    return ToolPlan(list(tools), mode, name, getattr(params, "parallel_tool_calls", None) is not False)
