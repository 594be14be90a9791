"""The JSON output grammar's nodes: what a compiled format is made of, and the constructors that
make one.

A compiled format is a graph of nodes (an object with its properties, an array with its item, a
string, a number, a literal set, a choice), each a ``Node`` of one kind with up to four fields
(listed below). The automaton that reads bytes against them is ``_nodes``; the frame kinds and a
byte's outcomes are numbered here, where both sides find them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

MAX_INDENT = 20  # spaces or tabs after a newline between two JSON tokens, at most
MAX_NUMBER = 32  # the longest number, in bytes
MAX_DEPTH = 64  # the deepest nesting a stack may reach

_serials = itertools.count()

# frame kinds
ROOT, OBJ, ARR, STR, NUM, LIT, ANY, ALT, KEY, PAT, RNUM, RAW = range(12)
# outcomes of one byte on the top frame
STAY, PUSH, POP, POP_BEFORE = range(4)


class Node:
    """One piece of the grammar; compared and hashed by a process-wide serial, so a memoised mask
    of a freed grammar can never be taken for a new one's."""

    __slots__ = ("kind", "serial", "a", "b", "c", "d")

    def __init__(
        self, kind: int, a: object = None, b: object = None, c: object = None, d: object = None
    ) -> None:
        self.kind, self.serial = kind, next(_serials)
        self.a, self.b, self.c, self.d = a, b, c, d

    def __hash__(self) -> int:
        return self.serial

    def __eq__(self, other: object) -> bool:
        return self is other

    def __repr__(self) -> str:
        return f"Node({self.kind}, #{self.serial})"


# Node fields by kind:
#   OBJ: a = properties ((name, encoded key bytes + b'"', node, required), ...), b = node of other
#        keys' values or None (no other keys), c = STR node of free keys (json_object) or None
#   ARR: a = item node, b = min items, c = max items or None
#   STR: a = min length, b = max length or None (in characters; None and 0: unbounded, not counted)
#   PAT: a = the _regex.Regex its text matches (pattern or format), b = min length, c = max length
#   RNUM: a = the _regex.Regex of a bounded number's text (_regex.integer_range, number_range)
#   RAW: a = the _regex.Regex the whole output matches, as plain text (vLLM's structured_outputs
#        regex; only ever the root's value)
#   NUM: a = integer only
#   LIT: a = the options' JSON bytes
#   ALT: a = the alternatives
#   ROOT: a = the value's node


def obj(props: tuple, other: Node | None) -> Node:
    node = Node(OBJ, props, other, string() if other is not None and not props else None)
    # one key node per place in the object, made here, so the states (and their masks) repeat
    keys: dict[int, Node | None] = {}
    for last in range(-1, len(props)):
        nxt, _ = _obj_allowed(node, last)
        keys[last] = None if not nxt and other is None else Node(KEY, node, tuple(nxt))
    node.d = keys
    return node


def array(item: Node, lo: int = 0, hi: int | None = None) -> Node:
    return Node(ARR, item, lo, hi)


def string(lo: int = 0, hi: int | None = None) -> Node:
    return Node(STR, lo, hi)


def pattern(regex: Any, lo: int = 0, hi: int | None = None) -> Node:
    return Node(PAT, regex, lo, hi)


def ranged(regex: Any) -> Node:
    return Node(RNUM, regex)


def raw(regex: Any) -> Node:
    return Node(RAW, regex)


def number(integer: bool) -> Node:
    return Node(NUM, integer)


def literal(options: Iterable[bytes]) -> Node:
    return Node(LIT, tuple(dict.fromkeys(options)))


def choice(nodes: Iterable[Node]) -> Node:
    flat: list[Node] = []
    for n in nodes:
        flat.extend(n.a if n.kind == ALT else (n,))  # type: ignore[arg-type]
    return flat[0] if len(flat) == 1 else Node(ALT, tuple(flat))


def root(value: Node) -> Node:
    return Node(ROOT, value)


def _obj_allowed(node: Node, last: int) -> tuple[list[int], bool]:
    """The declared properties that may come next after property ``last`` (in the schema's order,
    optional ones skippable) and whether the object may close."""
    props = node.a
    nxt = []
    for i in range(last + 1, len(props)):  # type: ignore[arg-type]
        nxt.append(i)
        if props[i][3]:  # type: ignore[index]
            return nxt, False
    return nxt, True


# Any JSON value: one node of each kind, the containers made of any values again.
ANY_VALUE = Node(ANY)
ANY_OBJECT = obj((), ANY_VALUE)
_ANY_KINDS = (ANY_OBJECT, array(ANY_VALUE), string(), number(False), literal((b"true", b"false", b"null")))
FREE_STRING = string()  # a string's place with its bounds taken off (the masks' shortcut)
