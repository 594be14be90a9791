"""The JSON output grammar as a byte-level pushdown automaton.

A compiled format is a graph of nodes (an object with its properties, an array with its item, a
string, a number, a literal set, a choice). A matcher state is a stack of frames, each frame a tuple
``(node, ...)`` of plain values, so states hash and compare (the token masks are memoised on them).
Several states live side by side where the grammar is ambiguous (a choice, an enum of 1 and 12, a
number that may go on or end): the matcher keeps the set and drops the ones a byte kills.

Here the stack: where a value starts, a byte's step (``advance`` dispatches the top frame's byte to
its kind's stepper), and what the token masks ask of a state. The nodes and their constructors are
``_graph``'s; the strings' steppers ``_strings``', the other values' ``_values``'.
"""

from __future__ import annotations

from ._graph import (
    _ANY_KINDS,
    ALT,
    ANY,
    ARR,
    FREE_STRING,
    KEY,
    LIT,
    MAX_DEPTH,
    NUM,
    OBJ,
    PAT,
    POP,
    PUSH,
    RAW,
    RNUM,
    ROOT,
    STAY,
    STR,
    Node,
)
from ._strings import _pattern, _raw, _string
from ._values import _array, _key, _number, _object, _ranged, begin_key


def begin(node: Node) -> list[tuple]:
    """The frames a value of ``node`` may start as (before its first byte)."""
    kind = node.kind
    if kind == ANY:
        return [f for n in _ANY_KINDS for f in begin(n)]
    if kind == ALT:
        return [f for n in node.a for f in begin(n)]  # type: ignore[attr-defined]
    if kind == OBJ:
        return [(node, 0, -1, -1, 0)]  # phase, last property, pending property, whitespace run
    if kind == ARR:
        return [(node, 0, 0, 0)]  # phase, items, whitespace run
    if kind == STR:
        return [(node, 0, 0, 0, 0)]  # phase, characters, hex digits due, UTF-8 bytes due
    if kind == PAT:
        # phase, characters, UTF-8 state or hex digits due, the regex's state, the code point so far
        return [(node, 0, 0, 0, node.a.start, 0)]  # type: ignore[attr-defined]
    if kind == NUM:
        return [(node, 0, 0)]  # phase, length
    if kind == RNUM:
        return [(node, node.a.start, 0)]  # type: ignore[attr-defined]  # the regex's state, length
    if kind == RAW:
        return [(node, node.a.start, 0, 0)]  # type: ignore[attr-defined]  # state, UTF-8 due, code so far
    if kind == LIT:
        return [(node, b"")]  # bytes so far
    if kind == ROOT:
        return [(node, 0, 0)]  # phase, whitespace run
    raise AssertionError(kind)


def advance(frame: tuple, b: int) -> list[tuple]:
    """The outcomes of byte ``b`` on a top frame: (STAY, frame), (PUSH, parent frame, child node)
    (the byte starts the child), (POP, result) (the byte ends the value), (POP_BEFORE, result)
    (the value ended before the byte)."""
    node = frame[0]
    kind = node.kind
    if kind == STR:
        return _string(frame, b)
    if kind == NUM:
        return _number(frame, b)
    if kind == PAT:
        return _pattern(frame, b)
    if kind == RNUM:
        return _ranged(frame, b)
    if kind == RAW:
        return _raw(frame, b)
    if kind == LIT:
        got = frame[1] + bytes((b,))
        out: list[tuple] = []
        longer = False
        for option in node.a:  # type: ignore[attr-defined]
            if option == got:
                out.append((POP, None))
            elif option.startswith(got):
                longer = True
        if longer:
            out.append((STAY, (node, got)))
        return out
    if kind == OBJ:
        return _object(frame, b)
    if kind == ARR:
        return _array(frame, b)
    if kind == KEY:
        return _key(frame, b)
    if kind == ROOT:  # the answer is the value: nothing before it, nothing after it
        return [] if frame[1] == 1 else [(PUSH, (node, 0, 0), node.a)]
    raise AssertionError(kind)


def child_done(frame: tuple, result: object) -> tuple | None:
    """The parent frame once the value it waits for has ended (``result``: the key's property)."""
    node = frame[0]
    kind = node.kind
    if kind == ROOT:
        return (node, 1, 0)
    if kind == ARR:
        return frame
    if kind == OBJ:
        _, phase, last, _pending, _run = frame
        if phase == 2:  # the key ended: its property (or -1, another key)
            prop = result if isinstance(result, int) else -1
            return (node, 3, prop if prop >= 0 else last, prop, 0)
        return frame
    raise AssertionError(kind)


def step(stack: tuple, b: int, out: set) -> None:
    """Add to ``out`` every stack byte ``b`` leads ``stack`` to."""
    for oc in advance(stack[-1], b):
        tag = oc[0]
        if tag == STAY:
            out.add(stack[:-1] + (oc[1],))
        elif tag == PUSH:
            if len(stack) >= MAX_DEPTH:
                continue
            parent, child = oc[1], oc[2]
            base = stack[:-1] + (parent,)
            if parent[0].kind == OBJ and parent[1] == 2:
                # a key: the object took its opening quote, the key starts inside the string
                out.add(base + (begin_key(child) if child.kind == KEY else (child, 1, 0, 0, 0),))
                continue
            for f in begin(child):
                step(base + (f,), b, out)
        elif tag == POP:
            parent = child_done(stack[-2], oc[1])
            if parent is not None:
                out.add(stack[:-2] + (parent,))
        else:  # POP_BEFORE: the byte belongs to the parent
            parent = child_done(stack[-2], oc[1])
            if parent is not None:
                step(stack[:-2] + (parent,), b, out)


def can_end(stack: tuple) -> bool:
    """Whether the output may end here (a whole value, or a number that may end)."""
    top = stack[-1]
    if len(stack) == 1:
        # a raw text's regex may match the empty text: then nothing at all is an answer
        return top[1] == 1 or (top[0].a.kind == RAW and top[0].a.a.accepts(top[0].a.a.start))  # type: ignore[attr-defined]
    if top[0].kind == RAW:
        return not top[2] and top[0].a.accepts(top[1])  # type: ignore[attr-defined]
    if (top[0].kind == NUM and top[1] in (2, 3, 5, 8)) or (
            top[0].kind == RNUM and top[2] and top[0].a.accepts(top[1])):  # type: ignore[attr-defined]
        parent = child_done(stack[-2], None)
        return parent is not None and can_end(stack[:-2] + (parent,))
    return False


def string_room(stack: tuple) -> tuple[int, int | None] | None:
    """Inside a string between characters (no escape, no character half read): the characters
    still due before it may close and the most it may still take (None: no bound); None
    elsewhere."""
    top = stack[-1]
    node = top[0]
    if node.kind != STR or top[1] != 1 or top[4]:
        return None
    if node.b is None and not node.a:
        return 0, None
    return node.a - top[2], None if node.b is None else node.b - top[2]  # type: ignore[operator]


def in_pattern(stack: tuple) -> bool:
    """Inside a pattern's string between two characters (no escape, no character half read)."""
    top = stack[-1]
    return top[0].kind == PAT and top[1] == 1 and not top[3]


def raw_place(stack: tuple) -> tuple | None:
    """Inside a plain-text regex's output between two characters, or before its first (the root
    about to take it): the stack with the regex's frame on top; None elsewhere."""
    top = stack[-1]
    if top[0].kind == RAW:
        return stack if not top[2] else None
    if len(stack) == 1 and top[0].kind == ROOT and top[1] == 0 and top[0].a.kind == RAW:  # type: ignore[attr-defined]
        return stack + tuple(begin(top[0].a))  # type: ignore[arg-type]
    return None


def unbounded(stack: tuple) -> tuple:
    """The same place with the string's length bounds taken off."""
    return stack[:-1] + ((FREE_STRING, 1, 0, 0, 0),)


def is_free_string(stack: tuple) -> bool:
    """Inside an unbounded string, not in an escape: every byte but '"', '\\' and the control
    bytes leaves the state as it is (the token masks' fast path)."""
    top = stack[-1]
    node = top[0]
    return node.kind == STR and top[1] == 1 and not top[4] and node.b is None and not node.a
