"""A grammar that holds only an answer's tool calls (``tool_choice`` "auto"): the text is free
until a call begins, then the call is held to its tool's schema, then the text is free again.

A call begins where a model whose chat template lists tools writes one: ``{"name": "<a listed
tool>"`` at the answer's start (bare, or after a Markdown ```` ```json ```` line), after an earlier
call, or after a ``<tool_call>`` tag. From the ``{`` on, the object is held to the grammar of
``{"name": <that tool>, "arguments": <its parameters>}`` (``ToolPlan``'s call schema), so its
arguments are valid JSON with the tool's keys and types; once the object closes, the text is
free again (``</tool_call>``, a next call, the end).

The hold begins only once a listed tool's whole name is out: an answer that is JSON but not a
call (``{"name": "Ada", ...}`` asked for by the user) is never bent into one. A prefix the call's
grammar refuses (the model wrote ``{"name":"f","args"`` in one token) is left free, as it was.
"""

from __future__ import annotations

import re
from typing import Any

from ._index import Matcher

_TAG = b"<tool_call>"


class CallsMatcher:
    """Where an auto answer stands: free text (``held`` None) or inside a call (``held``: the
    call object's matcher). Fed the answer's bytes as ``Matcher`` is."""

    __slots__ = ("_grammar", "held", "_text", "_start", "_from")

    def __init__(self, grammar: ToolCallsGrammar) -> None:
        self._grammar = grammar
        self.held: Matcher | None = None
        self._text = b""  # the free text since the answer's start or the last call's end
        self._start = True  # that text began where a bare call may (the answer's start, a call's end)
        self._from = 0  # where the next tagged call is looked for in it

    def feed(self, data: bytes) -> bool:
        """Advance over ``data``; False only for bytes a held call's grammar refuses."""
        if self.held is not None:
            if not self.held.feed(data):
                return False
            if self.held.done:  # the call object is closed: free text again
                self._release()
            return True
        self._text += data
        at = self._grammar.call_start(self._text, self._start, self._from)
        if at is not None:
            held = self._grammar.call.matcher()
            if held.feed(self._text[at:]):
                self.held = held
                if held.done:
                    self._release()
                return True
            self._start, self._from = False, at + 1  # not a call the grammar allows: as written
        self._forget()
        return True

    def _forget(self) -> None:
        """Keep only the free text a call may still begin in, so each token costs what it adds, not
        the answer so far: once no bare call can begin at the start, the text from where the next
        tag is looked for, and that from the last tag begun (or a tag's length back from the end)."""
        if self._start and not self._grammar.may_start_bare(self._text):
            self._start = False
        if self._start:
            return
        tag = self._text.rfind(_TAG, self._from)
        if tag >= 0 and not self._grammar.may_follow_tag(self._text[tag + len(_TAG):]):
            tag = -1  # a tag that prose follows: no call begins there any more
            self._from = len(self._text) - len(_TAG) + 1
        keep = tag if tag >= 0 else max(self._from, len(self._text) - len(_TAG) + 1)
        self._text, self._from = self._text[keep:], 0

    def _release(self) -> None:
        self.held, self._text, self._start, self._from = None, b"", True, 0

    def accepts(self, data: bytes) -> bool:
        return self.copy().feed(data)

    @property
    def free(self) -> bool:
        """Between calls: every token allowed, no mask."""
        return self.held is None

    def held_by(self) -> Matcher:
        """The call's matcher, whose mask applies inside a call (not ``free``)."""
        assert self.held is not None
        return self.held

    @property
    def done(self) -> bool:
        """The answer may end here: anywhere but inside a call."""
        return self.held is None

    @property
    def finished(self) -> bool:
        return False  # the end is the model's to choose

    def copy(self) -> CallsMatcher:
        out = CallsMatcher(self._grammar)
        out.held = self.held.copy() if self.held is not None else None
        out._text, out._start, out._from = self._text, self._start, self._from
        return out

    @property
    def key(self) -> Any:
        return ("calls", self.held.key if self.held is not None else None)


class ToolCallsGrammar:
    """The hold of an auto answer's calls: ``call`` (a ``Grammar`` of one call object, any listed
    tool) and the tools' ``names``. Quacks as ``Grammar`` for the engines (``matcher``,
    ``regexes``, ``key``, ``response_format``: how it travels to a replica); a whole call is
    checked with ``call.validate``."""

    kind = "tool_calls"

    def __init__(self, call: Any, names: list[str]) -> None:
        self.call = call
        self.names = list(names)
        self.response_format = {"type": self.kind, "names": self.names, "call": call.response_format}
        self.key = f"tool_calls:{self.names}:{call.key}"
        listed = b"|".join(re.escape(n.encode()) for n in sorted(self.names, key=len, reverse=True))
        head = rb'\{\s*"name"\s*:\s*"(?:' + listed + rb')"'
        self._bare = re.compile(rb"\s*(?:```json\s*)?(" + head + rb")")  # matched at the text's start
        self._tagged = re.compile(rb"<tool_call>\s*(" + head + rb")")
        # the longest bare head worth waiting for: {"name": "<the longest name>", with room for
        # white space between its tokens (a model writes one space or a newline and an indent)
        self._head_room = 64 + max(len(n.encode()) for n in self.names)

    def may_start_bare(self, text: bytes) -> bool:
        """Whether ``text`` (an answer's start) may still become a bare call: white space, then
        a start of a JSON fence or of an object. An object that is no call is let go once its
        head is whole (past a name's length and the keys' room)."""
        rest = text.lstrip()
        if rest[:1] == b"`":
            fence = b"```json"
            if not (rest.startswith(fence) or fence.startswith(rest)):
                return False
            rest = rest[len(fence):] if rest.startswith(fence) else b""
        return self.may_follow_tag(rest)

    def may_follow_tag(self, text: bytes) -> bool:
        """Whether ``text`` (what follows a ``<tool_call>`` tag, or a bare call's fence) may still
        become a call: white space, then the start of an object whose head is not yet whole."""
        rest = text.lstrip()
        return not rest or (rest[:1] == b"{" and len(rest) <= self._head_room)

    def call_start(self, text: bytes, start: bool, since: int) -> int | None:
        """Where a call's ``{`` is in ``text`` once its name is whole (None: no call begun)."""
        if start:
            found = self._bare.match(text)
            if found is not None:
                return found.start(1)
        tag = text.rfind(_TAG, since)
        if tag >= 0:
            found = self._tagged.match(text, tag)
            if found is not None:
                return found.start(1)
        return None

    def matcher(self) -> CallsMatcher:
        return CallsMatcher(self)

    def regexes(self) -> list[Any]:
        return self.call.regexes()

    def __repr__(self) -> str:
        return f"ToolCallsGrammar({self.names})"
