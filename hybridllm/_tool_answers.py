"""Reading a model's text answer as OpenAI tool calls: the cloud server's engine reads its answers
with this, and so does a device model whose chat template lists tools (``hybridllm._pipeline``).

- ``ToolCallReader``: one answer read as it streams, its text and its calls apart (a Hermes
  ``<tool_call>`` block, or call objects alone, bare or in one Markdown JSON block).

The plan it reads by (a request's tools, its ``tool_choice`` and the grammar that holds the
answer) is ``hybridllm._tool_plan.ToolPlan``.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from ._tool_plan import ToolPlan

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FENCE = "```json"  # a Markdown JSON block: Qwen2.5-Coder-1.5B writes its calls in one


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _call(name: str, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    return {"id": call_id or _call_id(), "type": "function",
            "function": {"name": name, "arguments": arguments}}


# an item of "required"'s array up to its arguments' value: the grammar writes the keys in this order
_ITEM_HEAD = re.compile(r'\s*[\[,]\s*\{\s*"name"\s*:\s*"([A-Za-z0-9_-]{1,64})"\s*,\s*"arguments"\s*:\s*')
_ITEM_TAIL = re.compile(r"\s*\}")  # a call object's close, after its arguments (any call)
# an auto answer's call in a Hermes <tool_call> block (the previous block's close before it) up to
# its arguments' object, its name first as the templates teach it ("parameters" too); or bare, at
# the answer's start (after a Markdown JSON line) or right after a bare call
_CALL_HEAD = r'\{\s*"name"\s*:\s*"([A-Za-z0-9_-]{1,64})"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)'
_AUTO_HEAD = re.compile(r"\s*(?:</tool_call>\s*)?<tool_call>\s*" + _CALL_HEAD)
_BARE_HEAD = re.compile(r"\s*(?:```json\s*)?" + _CALL_HEAD)


class _CallArray:
    """Calls read as they are written: each begins when its name is out, and its arguments follow
    as they come. ``"required"``'s answer, ``[{"name": ..., "arguments": ...}, ...]``, whose
    grammar fixes the shape (key order, JSON), so a header read once is never taken back; or an
    auto answer's calls (``_AUTO_HEAD``), ``names`` the tools' (another name: ``failed``, and
    nothing more is read) and ``limit`` the most calls read (parallel_tool_calls false: 1)."""

    def __init__(self, head: re.Pattern[str] = _ITEM_HEAD, tail: re.Pattern[str] = _ITEM_TAIL,
                 names: set[str] | None = None, limit: int | None = None) -> None:
        self.head, self.tail, self.names, self.limit = head, tail, names, limit
        self.failed = False  # an auto answer's call of no listed tool: not read as a call
        self.text = ""
        self.calls: list[dict[str, Any]] = []
        self._at = 0  # how far the text is read
        self._phase = "head"  # head: before an item's arguments; args: inside them; tail: after
        self._depth = 0
        self._started = False  # the arguments' value has begun
        self._in_string = self._escaped = False

    def feed(self, delta: str) -> list[dict[str, Any]]:
        """The deltas ``delta`` completes: a call's start (id, name) and its arguments' text."""
        self.text += delta
        out: list[dict[str, Any]] = []
        while self._at < len(self.text) and not self.failed:
            if self._phase == "head":
                if self.limit is not None and len(self.calls) >= self.limit:
                    break  # the rest is not read
                found = self.head.match(self.text, self._at)
                if found is None:
                    break  # not whole yet (or the array's end)
                if self.names is not None and found.group(1) not in self.names:
                    self.failed = True
                    break
                call = _call(found.group(1), "")
                self.calls.append(call)
                out.append({"index": len(self.calls) - 1, **call, "function": dict(call["function"])})
                self._at, self._phase, self._depth, self._started = found.end(), "args", 0, False
            elif self._phase == "args":
                if not self._started:  # whitespace before the value is not the arguments'
                    while self._at < len(self.text) and self.text[self._at] in " \t\r\n":
                        self._at += 1
                    if self._at == len(self.text):
                        break
                    self._started = True
                start = self._at
                while self._at < len(self.text) and self._phase == "args":
                    self._step(self.text[self._at])
                piece = self.text[start:self._at]
                if piece:
                    self.calls[-1]["function"]["arguments"] += piece
                    out.append({"index": len(self.calls) - 1, "function": {"arguments": piece}})
            else:
                found = self.tail.match(self.text, self._at)
                if found is None:
                    break
                self._at, self._phase = found.end(), "head"
        return out

    def _step(self, ch: str) -> None:
        """One character of an arguments value (an object, as OpenAI's parameters are; any JSON
        value is followed): the value ends where its brackets close, or its string or scalar ends."""
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif ch == "\\":
                self._escaped = True
            elif ch == '"':
                self._in_string = False
                if self._depth == 0:  # a string value: it ends here
                    self._at += 1
                    self._phase = "tail"
                    return
            self._at += 1
            return
        if ch in "{[":
            self._depth += 1
        elif ch in "}]" or (ch in ", \t\r\n" and self._depth == 0):
            if self._depth == 0:  # a scalar's end: the delimiter is not the value's
                self._phase = "tail"
                return
            self._depth -= 1
            if self._depth == 0:
                self._at += 1
                self._phase = "tail"
                return
        elif ch == '"':
            self._in_string = True
        self._at += 1


@dataclass
class ToolCallReader:
    """One choice's answer read as it streams: ``feed`` gives the text that may go out now (an
    auto answer's text before its first call; a prefix of ``<tool_call>`` is held back until it
    is told apart), ``take_deltas`` the tool-call deltas that may (a forced call's start and its
    arguments; an auto call's in a ``<tool_call>`` block once its name is out), ``finish`` the
    rest: ``(text, calls, finish_reason)``; the first ``streamed`` calls were begun by deltas
    already. A call begun (in a ``<tool_call>`` block, or bare at the answer's start, fenced or
    not) is a call, whatever follows it (the stream cannot take it back; the hold of an auto
    answer's calls, ``ToolCallsGrammar``, makes it whole and valid): text after the calls is
    dropped, and one cut by ``max_tokens`` keeps its partial arguments, as a forced call does."""

    plan: ToolPlan
    _held: str = ""
    _calls_text: str | None = None  # from the first call on (auto); all of it (forced)
    _sent: list[str] = field(default_factory=list)
    # a named function's call streams: its id, and the argument deltas not yet taken
    _id: str = field(default_factory=_call_id)
    _deltas: list[dict[str, Any]] = field(default_factory=list)
    streamed: int = 0  # calls already begun by deltas (their whole form is not sent again)
    _array: _CallArray | None = None  # "required"'s answer, read as it comes
    _auto: _CallArray | None = None  # an auto answer's calls, read as they come once one begins

    def feed(self, delta: str) -> str:
        if self.plan.mode == "named":  # all of it is the arguments: they stream as they come
            start = not self._held.strip()
            self._held += delta
            if not self._held.strip():
                return ""
            if start:
                self.streamed = 1
                self._deltas.append({"index": 0, "id": self._id, "type": "function",
                                     "function": {"name": self.plan.name, "arguments": self._held.lstrip()}})
            elif delta:
                self._deltas.append({"index": 0, "function": {"arguments": delta}})
            return ""
        if self.plan.mode == "required":  # each call begins once its name is out, then its arguments
            if self._array is None:
                self._array = _CallArray()
            self._held += delta
            self._deltas += self._array.feed(delta)
            self.streamed = len(self._array.calls)
            return ""
        if self.plan.mode != "auto":
            self._held += delta
            return ""
        if self._calls_text is not None:
            self._calls_text += delta
            self._read_auto(delta)
            return ""
        text = self._held + delta
        if not self._sent:  # the answer's start: a bare JSON call (fenced or not) is held
            head = text.lstrip()
            if not head or (len(head) < len(FENCE) and FENCE.startswith(head)):  # not told apart yet
                self._held = text
                return ""
            if head.startswith(("{", FENCE)):
                self._held, self._calls_text = "", text
                self._read_auto(text, _BARE_HEAD)
                return ""
        at = text.find(OPEN)
        if at >= 0:
            self._held, self._calls_text = "", text[at:]
            self._read_auto(text[at:])
            return self._send(text[:at])
        keep = next((k for k in range(min(len(OPEN) - 1, len(text)), 0, -1) if OPEN.startswith(text[-k:])), 0)
        self._held = text[len(text) - keep:] if keep else ""
        return self._send(text[:len(text) - keep])

    def _read_auto(self, text: str, head: re.Pattern[str] = _AUTO_HEAD) -> None:
        """More of an auto answer's calls (``head``: tagged, or bare from the answer's start):
        once a call's name is out (a listed tool's, its arguments an object), it begins, and its
        arguments stream as they are written."""
        if self._auto is None:
            names = {t["function"]["name"] for t in self.plan.tools}
            self._auto = _CallArray(head, _ITEM_TAIL, names, None if self.plan.parallel else 1)
        self._deltas += self._auto.feed(text)
        self.streamed = len(self._auto.calls)

    def take_deltas(self) -> list[dict[str, Any]]:
        """The tool-call deltas ready to go out (a forced call's start, its arguments as they come)."""
        out, self._deltas = self._deltas, []
        return out

    def _send(self, text: str) -> str:
        if text:
            self._sent.append(text)
        return text

    def finish(self, reason: str) -> tuple[str, list[dict[str, Any]], str]:
        """``(text still to send, calls, finish_reason)``: "tool_calls" when an auto or required
        answer called (OpenAI's; a named function's answer ends with "stop"), "length" kept."""
        if self.plan.mode == "named":  # its arguments as written (cut short where max_tokens cut them)
            assert self.plan.name is not None
            return "", [_call(self.plan.name, self._held.strip(), self._id)], reason
        if self.plan.mode == "required":  # the calls as written (the last cut where max_tokens cut it)
            made = self._array.calls if self._array is not None else []
            if not made:  # cut short before a call's name: the text is the answer
                return self._send(self._held), [], reason
            return "", made, "tool_calls" if reason == "stop" else reason
        names = {t["function"]["name"] for t in self.plan.tools}
        if self._auto is not None and self._auto.calls:  # begun as they streamed: as written
            made = list(self._auto.calls)
            whole = _tagged_calls(self._calls_text or "", names) if self.plan.parallel else None
            if whole is not None and len(whole) > len(made):  # a later one not read as it came
                made += whole[len(made):]  # (its arguments written as a JSON text): whole now
            return "", made, "tool_calls" if reason == "stop" else reason
        rest = self._held
        if self._calls_text is not None:
            calls = _tagged_calls(self._calls_text, names)
            if calls is not None:  # parallel_tool_calls false: the first call is the answer's
                kept = calls if self.plan.parallel else calls[:1]
                return "", kept, "tool_calls" if reason == "stop" else reason
            rest += self._calls_text  # not calls after all: the model's text, as it wrote it
        return self._send(rest), [], reason

    def content(self) -> str | None:
        """The whole text sent (an answer that only called has none: null, as OpenAI's)."""
        text = "".join(self._sent)
        return text if text.strip() else None


def _tagged_calls(text: str, names: set[str]) -> list[dict[str, Any]] | None:
    """The calls in ``<tool_call>{json}</tool_call>`` blocks (the last may be left open: the answer
    ended there), or calls written bare (``{"name": ..., "arguments": {...}}`` alone, as small
    models write them without the tags), or bare in a Markdown JSON block and nothing else (as
    Qwen2.5-Coder-1.5B writes them); None when one is not a call of a known function with an
    arguments object (then the model's text is its answer)."""
    text = text.strip()
    if text.startswith(FENCE):  # the calls in a Markdown JSON block, alone
        body = text[len(FENCE):]
        return _bare_calls(body.removesuffix("```").strip(), names)
    if not text.startswith(OPEN):
        return _bare_calls(text, names)
    calls = []
    for block in text.split(OPEN)[1:]:
        body, _, after = block.partition(CLOSE)
        if after.strip():  # only whitespace may stand between or after the blocks
            return None
        call = _one_call(body, names)
        if call is None:
            return None
        calls.append(call)
    return calls


def _bare_calls(text: str, names: set[str]) -> list[dict[str, Any]] | None:
    """Calls written as JSON objects one after another (whitespace between), without the tags."""
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(text):
        try:
            value, end = decoder.raw_decode(text, at)
        except ValueError:
            return None
        call = _one_call(value, names)
        if call is None:
            return None
        calls.append(call)
        at = len(text) - len(text[end:].lstrip())
    return calls or None


def _one_call(text: Any, names: set[str]) -> dict[str, Any] | None:
    """A call from its JSON object (or that object's text); None when it is not one."""
    if isinstance(text, str):
        try:
            value = json.loads(text)
        except ValueError:
            return None
    else:
        value = text
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):  # arguments written as a JSON text
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return _call(value["name"], json.dumps(args, ensure_ascii=False))
