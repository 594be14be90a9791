"""The other JSON values' bytes, one at a time: objects and their keys, arrays, the whitespace
between their tokens, and numbers (free, or held to a range's regex, ``RNUM``).

Each stepper takes a top frame and a byte and returns the byte's outcomes, as ``_nodes.advance``
does (which dispatches here); a container's child is pushed (``PUSH``), not read here.
"""

from __future__ import annotations

from ._graph import MAX_INDENT, MAX_NUMBER, POP, POP_BEFORE, PUSH, STAY, Node, _obj_allowed
from ._strings import _ESCAPES, _HEX, utf8_prefix

_DIGITS = frozenset(b"0123456789")


def _ws(frame: tuple, b: int, run_index: int) -> list[tuple] | None:
    """Whitespace between two JSON tokens, in the forms JSON writers use: one space, or a newline
    and an indent of up to MAX_INDENT spaces or tabs ([] for any other: a model cannot stall in a
    run of tabs or blank lines). None when ``b`` is no whitespace. The run's state: 0 none yet,
    1 a space, 2 + k a newline and k indent characters."""
    if b not in (0x20, 0x0A, 0x09, 0x0D):
        return None
    run = frame[run_index]
    if run == 0 and b in (0x20, 0x0A):
        nxt = 1 if b == 0x20 else 2
    elif run >= 2 and b in (0x20, 0x09) and run - 2 < MAX_INDENT:
        nxt = run + 1
    else:
        return []
    return [(STAY, frame[:run_index] + (nxt,) + frame[run_index + 1 :])]


def _object(frame: tuple, b: int) -> list[tuple]:
    # phases: 0 before '{', 1 after '{', 3 after a key, 4 after ':', 5 after a value, 6 after ','
    node, phase, last, pending, _run = frame
    if phase == 0:
        return [(STAY, (node, 1, -1, -1, 0))] if b == 0x7B else []
    ws = _ws(frame, b, 4)
    if ws is not None:
        return ws
    if phase in (1, 6):
        out: list[tuple] = []
        if b == 0x22:
            key = _key_start(node, last)
            if key is not None:
                out.append((PUSH, (node, 2, last, -1, 0), key))
        if b == 0x7D and phase == 1 and _obj_allowed(node, last)[1]:
            out.append((POP, None))
        return out
    if phase == 3:
        return [(STAY, (node, 4, last, pending, 0))] if b == 0x3A else []
    if phase == 4:
        child = node.a[pending][2] if pending >= 0 else node.b  # type: ignore[index]
        return [(PUSH, (node, 5, last, pending, 0), child)]
    if phase == 5:
        if b == 0x2C:
            nxt, _ = _obj_allowed(node, last)
            if nxt or node.b is not None:
                return [(STAY, (node, 6, last, -1, 0))]
            return []
        if b == 0x7D and _obj_allowed(node, last)[1]:
            return [(POP, None)]
        return []
    return []


def _key_start(node: Node, last: int) -> Node | None:
    """The node that reads the key after an object's opening quote (the quote is the object's)."""
    if node.c is not None:  # free keys (json_object): a plain string, no names to check
        return node.c  # type: ignore[return-value]
    return node.d[last]  # type: ignore[index,no-any-return]


def begin_key(key: Node) -> tuple:
    return (key, b"", 0)  # raw bytes so far, escape state (0 none, 1 after '\', 2-5 hex digits due)


def _key(frame: tuple, b: int) -> list[tuple]:
    # A declared name (encoded as JSON, closing quote included) or, when the object takes other
    # keys, any string that is not a declared name out of its turn.
    key, raw, esc = frame
    obj_node, candidates = key.a, key.b
    props = obj_node.a
    got = raw + bytes((b,))
    out: list[tuple] = []
    longer = False
    for i in candidates:
        enc = props[i][1]
        if enc == got:
            out.append((POP, i))
        elif enc.startswith(got):
            longer = True
    if obj_node.b is None:
        if longer:
            out.append((STAY, (key, got, 0)))
        return out
    # other keys allowed: follow the string's rules and decide at the closing quote
    if esc == 0:
        if b == 0x22:
            if out:
                return out
            name = _decoded(raw)
            if name is None or any(p[0] == name for p in props):
                return []  # a declared name is only taken in its turn, and only once
            return [(POP, -1)]
        if b < 0x20 or (b >= 0x80 and not utf8_prefix(got)):
            return []
        return [(STAY, (key, got, 1 if b == 0x5C else 0))]
    if esc == 1:
        if b not in _ESCAPES:
            return []
        return [(STAY, (key, got, 2 if b == 0x75 else 0))]
    if b not in _HEX:
        return []
    return [(STAY, (key, got, esc + 1 if esc < 5 else 0))]


def _decoded(raw: bytes) -> str | None:
    import json

    try:
        return json.loads(b'"' + raw + b'"')  # type: ignore[no-any-return]
    except ValueError:
        return None


def _array(frame: tuple, b: int) -> list[tuple]:
    # phases: 0 before '[', 1 after '[', 2 after an item, 3 after ','
    node, phase, count, _run = frame
    lo, hi = node.b, node.c
    if phase == 0:
        return [(STAY, (node, 1, 0, 0))] if b == 0x5B else []
    ws = _ws(frame, b, 3)
    if ws is not None:
        return ws
    counted = lo or hi is not None
    if phase == 1 and b == 0x5D:
        return [(POP, None)] if lo == 0 else []
    if phase in (1, 3):
        if hi is not None and count >= hi:
            return []
        return [(PUSH, (node, 2, count + 1 if counted else 0, 0), node.a)]
    if phase == 2:
        if b == 0x2C:
            return [(STAY, (node, 3, count, 0))] if hi is None or count < hi else []
        if b == 0x5D:
            return [(POP, None)] if count >= lo else []
    return []


def _number(frame: tuple, b: int) -> list[tuple]:
    # phases: 0 start, 1 after '-', 2 integer digits, 3 a leading 0, 4 after '.', 5 fraction
    # digits, 6 after 'e', 7 after the exponent's sign, 8 exponent digits; 2, 3, 5, 8 may end
    node, phase, length = frame
    integer = node.a
    nxt = -1
    digit = b in _DIGITS
    if phase == 0:
        nxt = 1 if b == 0x2D else 3 if b == 0x30 else 2 if digit else -1
    elif phase == 1:
        nxt = 3 if b == 0x30 else 2 if digit else -1
    elif phase in (2, 3):
        if phase == 2 and digit:
            nxt = 2
        elif b == 0x2E and not integer:
            nxt = 4
        elif b in (0x65, 0x45) and not integer:
            nxt = 6
    elif phase in (4, 5):
        if digit:
            nxt = 5
        elif phase == 5 and b in (0x65, 0x45):
            nxt = 6
    elif phase == 6:
        nxt = 7 if b in (0x2B, 0x2D) else 8 if digit else -1
    elif phase in (7, 8):
        nxt = 8 if digit else -1
    out: list[tuple] = []
    # a byte is taken only if the number can still end within MAX_NUMBER bytes after it
    if nxt >= 0 and length + 1 + (nxt in (1, 4, 6, 7)) <= MAX_NUMBER:
        out.append((STAY, (node, nxt, length + 1)))
    if phase in (2, 3, 5, 8):
        out.append((POP_BEFORE, None))
    return out


def _ranged(frame: tuple, b: int) -> list[tuple]:
    # a number within bounds: its text held to the range's regex; like a number, it ends
    # before the first byte that cannot go on it
    node, state, length = frame
    out: list[tuple] = []
    if length < MAX_NUMBER and (b in (0x2D, 0x2E) or b in _DIGITS):
        # taken only if the number can still end within MAX_NUMBER bytes after it
        nxt = node.a.step_within(state, b, 0, MAX_NUMBER - length - 1)  # type: ignore[attr-defined]
        if nxt:
            out.append((STAY, (node, nxt, length + 1)))
    if length and node.a.accepts(state):  # type: ignore[attr-defined]
        out.append((POP_BEFORE, None))
    return out
