"""OpenAI function calling on the cloud server: the request's tools told to the model, its answer
read back as tool calls.

- ``tools`` reach the model's chat template (Qwen2.5's lists them in its system turn), and the
  conversation's earlier calls and results reach it too (``template_messages``).
- ``tool_choice``: ``"auto"`` (the default with tools) lets the model answer or call; its calls
  are read from the ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks the
  template taught it (the Hermes format, Qwen2.5's), or from an answer that is such objects alone
  (Qwen2.5-Coder-0.5B writes them without the tags), bare or in one Markdown JSON block (the
  1.5B writes them so). ``"required"`` and a named function are
  constrained by a grammar, so the answer is always a call whose arguments fit the function's
  ``parameters`` schema: a JSON array of ``{"name", "arguments"}`` for ``"required"`` (one
  item when ``parallel_tool_calls`` is false), the arguments object alone for a named function.
  ``"none"``: the tools are not shown to the model and its answer is text.
- Streamed, a forced call's arguments stream as they come (a call's first delta carries its
  index, id and name; "required"'s calls begin one after another as each name is out), as OpenAI
  streams them and as partial-object clients read them. An auto answer's text streams until a
  call begins; its calls come whole, one delta per call, when the choice ends (they are read from
  the whole answer). An auto answer that starts with ``{`` or a JSON block may be a bare call: it
  is held and sent whole at its end.

The plan and the reader live in ``hybridllm._tools`` (a device model whose template lists tools
reads its answer with them too); here, the conversation's calls given to the template.
"""

from __future__ import annotations

import json
from typing import Any

from hybridllm._tools import FENCE, ToolCallReader, ToolPlan
from hybridllm.wire.errors import WireError
from hybridllm.wire.requests import checked_tools, tool_choice_of

__all__ = ["FENCE", "ToolCallReader", "ToolPlan", "checked_tools", "template_messages", "tool_choice_of"]


def template_messages(messages: list[Any], sent: list[dict[str, Any]]) -> None:
    """Earlier calls and results in ``sent`` (the template's messages), in place: an assistant
    turn's ``tool_calls`` (their ``arguments``, a JSON text on the wire, as the object the
    templates write with ``| tojson``; a text that is not JSON stays a text) and a tool turn's
    ``tool_call_id``. A call without a function name is a 400 naming it."""
    for i, (message, out) in enumerate(zip(messages, sent, strict=True)):
        if message.tool_call_id is not None and message.role == "tool":
            out["tool_call_id"] = message.tool_call_id
        if not message.tool_calls or message.role != "assistant":
            continue
        calls = []
        for j, call in enumerate(message.tool_calls):
            where = f"messages[{i}].tool_calls[{j}]"
            fn = call.get("function")
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise WireError(f"Invalid '{where}': expected {{\"id\": ..., \"type\": \"function\", "
                                "\"function\": {\"name\": ..., \"arguments\": \"{...}\"}}.", param=where)
            args = fn.get("arguments", "{}")
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except ValueError:
                    pass  # as written: the template writes it as a JSON string
            calls.append({"id": call.get("id"), "type": "function",
                          "function": {"name": fn["name"], "arguments": args}})
        out["tool_calls"] = calls
