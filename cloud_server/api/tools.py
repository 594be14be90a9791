"""OpenAI function calling on the cloud server: the request's tools told to the model, its answer
read back as tool calls.

- ``tools`` reach the model's chat template (Qwen2.5's lists them in its system turn), and the
  conversation's earlier calls and results reach it too (``template_messages``).
- ``tool_choice``: ``"auto"`` (the default with tools) lets the model answer or call; its calls
  are read from the ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks the
  template taught it (the Hermes format, Qwen2.5's), or from an answer that is such objects alone
  (Qwen2.5-Coder-0.5B writes them without the tags), bare or in one Markdown JSON block (the
  1.5B writes them so); each call is held to its tool's schema once its name is out, the text
  around the calls left free (``hybridllm._structured.ToolCallsGrammar``). ``"required"`` and a
  named function are
  constrained by a grammar, so the answer is always a call whose arguments fit the function's
  ``parameters`` schema: a JSON array of ``{"name", "arguments"}`` for ``"required"`` (one
  item when ``parallel_tool_calls`` is false), the arguments object alone for a named function.
  ``"none"``: the tools are not shown to the model and its answer is text.
- Streamed, a forced call's arguments stream as they come (a call's first delta carries its
  index, id and name; "required"'s calls begin one after another as each name is out), as OpenAI
  streams them and as partial-object clients read them. An auto answer's text streams until a
  call begins; a call streams too once its name is out (its arguments as written), in a
  ``<tool_call>`` block or bare at the answer's start (fenced or not); calls read only from the
  whole answer (a later call written differently) come whole when the choice ends. An auto
  answer that starts with ``{`` or a JSON block is held until it is told apart: a call, or JSON
  that is the model's text (sent whole at its end).

The plan and the reader live in ``hybridllm._tool_plan`` and ``hybridllm._tool_answers`` (a device
model whose template lists tools reads its answer with them too); here, the conversation's calls
given to the template.
"""

from __future__ import annotations

from typing import Any

from hybridllm._message_text import calls_for_template
from hybridllm._tool_answers import FENCE, ToolCallReader
from hybridllm._tool_plan import ToolPlan
from hybridllm.wire.requests import checked_calls, checked_tools, tool_choice_of

__all__ = ["FENCE", "ToolCallReader", "ToolPlan", "checked_tools", "template_messages", "tool_choice_of"]


def template_messages(messages: list[Any], sent: list[dict[str, Any]]) -> None:
    """Earlier calls and results in ``sent`` (the template's messages), in place: an assistant
    turn's ``tool_calls`` (their ``arguments``, a JSON text on the wire, as the object the
    templates write with ``| tojson``; a text that is not JSON stays a text) and a tool turn's
    ``tool_call_id``. A call without a function name is a 400 naming it."""
    for i, (message, out) in enumerate(zip(messages, sent, strict=True)):
        if message.tool_call_id is not None and message.role == "tool":
            out["tool_call_id"] = message.tool_call_id
        if message.tool_calls and message.role == "assistant":
            calls = checked_calls(message.tool_calls, f"messages[{i}].tool_calls")
            out["tool_calls"] = calls_for_template([{"role": "assistant", "tool_calls": calls}])[0][
                "tool_calls"]
