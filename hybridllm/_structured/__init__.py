"""Structured output: OpenAI's ``response_format`` (``json_object``, ``json_schema``) as a grammar
that masks each next token, on every route (cloud engine, llama.cpp, ONNX Runtime) alike.

``parse_response_format`` reads the request's field into a ``Grammar`` (or None for text);
``Grammar.matcher()`` follows one output byte by byte; a ``TokenIndex`` built once per vocabulary
gives the tokens a matcher allows next.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from . import _nodes
from ._index import Matcher, TokenIndex
from ._schema import ResponseFormatError, normalize
from ._tokens import token_bytes_from_tokenizer

__all__ = [
    "Grammar", "Matcher", "ResponseFormatError", "TokenIndex", "parse_response_format",
    "token_bytes_from_tokenizer",
]


class Grammar:
    """One ``response_format``: the values an output may be."""

    __slots__ = ("key", "kind", "response_format", "_root", "_regexes")

    def __init__(self, response_format: dict, value: _nodes.Node) -> None:
        self.response_format = response_format
        self.kind: str = response_format["type"]
        # the user's property order is part of the grammar (keys come out in it): no sort_keys
        self.key = json.dumps(response_format, separators=(",", ":"), ensure_ascii=False)
        self._root = _nodes.root(value)
        self._regexes: list[Any] | None = None

    def matcher(self) -> Matcher:
        return Matcher(frozenset((f,) for f in _nodes.begin(self._root)))

    def regexes(self) -> list[Any]:
        """The compiled patterns and formats its strings are held to (``TokenIndex.prepare``;
        found once, the grammar is kept across requests)."""
        if self._regexes is not None:
            return self._regexes
        found: dict[int, Any] = {}
        seen: set[int] = set()
        todo = [self._root]
        while todo:
            node = todo.pop()
            if node.serial in seen:
                continue
            seen.add(node.serial)
            if node.kind == _nodes.PAT:
                found[id(node.a)] = node.a
            elif node.kind == _nodes.OBJ:
                todo.extend(p[2] for p in node.a)  # type: ignore[attr-defined]
                todo.extend(x for x in (node.b,) if x is not None)  # type: ignore[misc]
            elif node.kind in (_nodes.ARR, _nodes.ROOT):
                todo.append(node.a)  # type: ignore[arg-type]
            elif node.kind == _nodes.ALT:
                todo.extend(node.a)  # type: ignore[arg-type]
        self._regexes = list(found.values())
        return self._regexes

    def validate(self, text: str) -> bool:
        """Whether ``text`` is a value this grammar produces (whitespace around it allowed)."""
        m = self.matcher()
        return m.feed(text.strip().encode("utf-8", "surrogatepass")) and m.done

    def __repr__(self) -> str:
        return f"Grammar({self.key})"


_GRAMMARS: OrderedDict[str, Grammar] = OrderedDict()
_GRAMMARS_SIZE = 256  # formats kept compiled
_lock = threading.Lock()


def parse_response_format(value: Any) -> Grammar | None:
    """OpenAI's ``response_format`` (a dict, or None) as a grammar; None for ``text``.

    The same format asked again (by JSON) is the same Grammar object, so its states, and the
    token masks memoised on them, repeat across requests. Raises ``ResponseFormatError`` (a
    ValueError; ``.param`` names the field) for what cannot be served, saying what to change."""
    try:
        seen = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        seen = None  # not plain JSON (a pydantic object): compiled afresh, normalize rules on it
    if seen is not None:
        with _lock:
            grammar = _GRAMMARS.get(seen)
            if grammar is not None:
                _GRAMMARS.move_to_end(seen)
                return grammar
    normalized, node = normalize(value)
    if normalized is None or node is None:
        return None
    grammar = Grammar(normalized, node)
    with _lock:
        # a format written as its own normalized form is the same grammar
        grammar = _GRAMMARS.setdefault(grammar.key, grammar)
        if seen is not None:
            _GRAMMARS[seen] = grammar
        while len(_GRAMMARS) > _GRAMMARS_SIZE:
            _GRAMMARS.popitem(last=False)
    return grammar
