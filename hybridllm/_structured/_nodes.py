"""The JSON output grammar as a byte-level pushdown automaton.

A compiled format is a graph of nodes (an object with its properties, an array with its item, a
string, a number, a literal set, a choice). A matcher state is a stack of frames, each frame a tuple
``(node, ...)`` of plain values, so states hash and compare (the token masks are memoised on them).
Several states live side by side where the grammar is ambiguous (a choice, an enum of 1 and 12, a
number that may go on or end): the matcher keeps the set and drops the ones a byte kills.
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

_DIGITS = frozenset(b"0123456789")
_ESCAPES = frozenset(b'"\\/bfnrtu')  # after a backslash (the short ones: _ESCAPED below, and u)
_HEX = frozenset(b"0123456789abcdefABCDEF")


class Node:
    """One piece of the grammar; compared and hashed by a process-wide serial, so a memoised mask
    of a freed grammar can never be taken for a new one's."""

    __slots__ = ("kind", "serial", "a", "b", "c", "d")

    def __init__(self, kind: int, a: object = None, b: object = None, c: object = None,
                 d: object = None) -> None:
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
    return [(STAY, frame[:run_index] + (nxt,) + frame[run_index + 1:])]


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


def advance(frame: tuple, b: int) -> list[tuple]:
    """The outcomes of byte ``b`` on a top frame: (STAY, frame), (PUSH, parent frame, child node)
    (the byte starts the child), (POP, result) (the byte ends the value), (POP_BEFORE, result)
    (the value ended before the byte)."""
    node = frame[0]
    kind = node.kind
    if kind == STR:
        _, phase, chars, hexes, utf = frame
        lo, hi = node.a, node.b
        if phase == 0:
            return [(STAY, (node, 1, 0, 0, 0))] if b == 0x22 else []
        if phase == 1:
            if utf:  # inside a multi-byte character
                nxt = utf8_next(utf, b)
                return [] if nxt is None else [(STAY, (node, 1, chars, 0, nxt))]
            if b == 0x22:
                return [(POP, None)] if chars >= lo else []
            if b == 0x5C:  # an escape is one more character
                return [(STAY, (node, 2, chars, 0, 0))] if hi is None or chars < hi else []
            if b < 0x20:
                return []
            nxt = utf8_next(0, b)
            if nxt is None:
                return []
            if hi is None and not lo:
                return [(STAY, frame if not nxt else (node, 1, 0, 0, nxt))]
            if hi is not None and chars >= hi:
                return []
            return [(STAY, (node, 1, chars + 1, 0, nxt))]
        if phase == 2:  # after a backslash
            if b not in _ESCAPES:
                return []
            counted = chars if hi is None and not lo else chars + 1
            if hi is not None and counted > hi:
                return []
            return [(STAY, (node, 3, counted, 4, 0) if b == 0x75 else (node, 1, counted, 0, 0))]
        # phase 3: \u's hex digits (the code so far in the last slot)
        if b not in _HEX:
            return []
        code = utf * 16 + int(chr(b), 16)
        if hexes > 1:
            bits = 4 * (hexes - 1)
            if not _escapable(code << bits, (code << bits) | ((1 << bits) - 1)):
                return []
            return [(STAY, (node, 3, chars, hexes - 1, code))]
        return [(STAY, (node, 1, chars, 0, 0))] if _escapable(code, code) else []
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


_ESCAPED = {0x22: 0x22, 0x5C: 0x5C, 0x2F: 0x2F, 0x62: 0x08, 0x66: 0x0C, 0x6E: 0x0A, 0x72: 0x0D, 0x74: 0x09}


def _pattern(frame: tuple, b: int) -> list[tuple]:
    # A string whose text (its characters, escapes read) matches a regex. Phases: 0 before '"',
    # 1 between characters or inside a UTF-8 one (``pend``: utf8_next's state), 2 after '\',
    # 3 in \u's hex digits (``pend``: digits due). A byte is taken only while some character it
    # may begin leads the regex on within the length bounds, so no state is a dead end.
    node, phase, chars, pend, state, code = frame
    regex = node.a
    if phase == 0:
        return [(STAY, (node, 1, 0, 0, state, 0))] if b == 0x22 else []
    if phase == 1 and not pend:
        if b == 0x22:
            return [(POP, None)] if regex.accepts(state) and chars >= node.b else []  # type: ignore[attr-defined]
        if b == 0x5C:  # an escape: kept if some character it may write leads on
            return _pattern_partial((node, 2, chars, 0, state, 0), 0, 0, 16)
        if b < 0x20:
            return []
        nxt = utf8_next(0, b)
        if nxt is None:
            return []
        if not nxt:
            return _pattern_char(frame, b)
        left = nxt[0]
        return _pattern_partial(frame, (nxt, left + 1), _lead_bits(b, left), 6 * left)
    if phase == 1:  # inside a multi-byte character: pend = (utf8_next's state, its length)
        nxt = utf8_next(pend[0], b)
        if nxt is None:
            return []
        code = (code << 6) | (b & 0x3F)
        if not nxt:
            return _pattern_char(frame, code)
        return _pattern_partial(frame, (nxt, pend[1]), code, 6 * nxt[0])
    if phase == 2:
        if b == 0x75:  # \u: four hex digits
            return _pattern_partial((node, 3, chars, 0, state, 0), 4, 0, 16)
        return _pattern_char(frame, _ESCAPED[b]) if b in _ESCAPED else []
    if b not in _HEX:  # phase 3
        return []
    code = code * 16 + int(chr(b), 16)
    if pend > 1:
        return _pattern_partial(frame, pend - 1, code, 4 * (pend - 1))
    if 0xD800 <= code <= 0xDFFF or not _escapable(code, code):  # a surrogate: a pair is not read here
        return []
    return _pattern_char(frame, code)


_UTF8_LOWEST = {2: 0x80, 3: 0x800, 4: 0x10000}  # no overlong forms


def _lead_bits(b: int, left: int) -> int:
    """A UTF-8 lead byte's own bits of its code point (``left`` continuation bytes to come)."""
    return b & (0x1F if left == 1 else 0x0F if left == 2 else 0x07)
_UTF8_HIGHEST = {2: 0x7FF, 3: 0xFFFF, 4: 0x10FFFF}


# What a \uXXXX escape may write: what JSON writers escape that way (control characters, the quote
# and the backslash, and what lies past ASCII: ensure_ascii). '9' written as \u0039 is valid JSON
# but no writer's: a model let into it spent its tokens on escapes (SmolLM2 wrote a date as
# "12\u00391\u002d1\u0032..." and ran out of tokens).
_ESCAPABLE = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0xFFFF))


def _escapable(lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of [lo, hi] a \\u escape may write."""
    return [(max(lo, a), min(hi, b)) for a, b in _ESCAPABLE if max(lo, a) <= min(hi, b)]


def _pattern_partial(frame: tuple, pend: Any, code: int, bits: int) -> list[tuple]:
    """A character begun: kept if some code point it may still become leads the regex on."""
    node, phase, chars, _, state, _ = frame
    need, room = _pattern_room(node, chars)
    if room is not None and room < 0:
        return []
    lo, hi = code << bits, (code << bits) | ((1 << bits) - 1)
    if isinstance(pend, tuple):  # UTF-8: a character of n bytes is one of n bytes' code points
        parts = [(max(lo, _UTF8_LOWEST[pend[1]]), min(hi, _UTF8_HIGHEST[pend[1]]))]
    elif phase == 3:  # a \u escape: only what writers escape
        parts = _escapable(lo, hi)
    else:  # after '\\': a short escape (its characters are escapable ones, and '/') or \\u
        parts = [*_escapable(lo, hi), (0x2F, 0x2F)]
    if not any(a <= b and node.a.can_step(state, a, b, need, room) for a, b in parts):  # type: ignore[attr-defined]
        return []
    return [(STAY, (node, phase, chars, pend, state, code))]


def _pattern_room(node: Node, chars: int) -> tuple[int, int | None]:
    """After one more character: the characters still due and the most that may still come."""
    return node.b - chars - 1, None if node.c is None else node.c - chars - 1  # type: ignore[operator]


def _pattern_char(frame: tuple, code: int) -> list[tuple]:
    """A whole character: the regex's next state, if it leaves a match within the bounds."""
    node, _, chars, _, state, _ = frame
    need, room = _pattern_room(node, chars)
    if room is not None and room < 0:
        return []
    nxt = node.a.step_within(state, code, need, room)  # type: ignore[attr-defined]
    counted = chars + 1 if node.b or node.c is not None else 0  # unbounded: not counted (states repeat)
    return [(STAY, (node, 1, counted, 0, nxt, 0))] if nxt else []


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


def _raw(frame: tuple, b: int) -> list[tuple]:
    # Plain text held to a regex, a UTF-8 character at a time (``pend``: utf8_next's state and the
    # character's length; ``code``: its bits so far). A byte is taken only while some character it
    # may begin leads the regex on, so no state is a dead end; the text may end wherever the
    # regex accepts (can_end), and nothing comes after it.
    node, state, pend, code = frame
    regex = node.a
    nxt = utf8_next(pend[0] if pend else 0, b)
    if nxt is None:
        return []
    if not pend:
        if not nxt:  # ASCII: a whole character
            after = regex.step(state, b)  # type: ignore[attr-defined]
            return [(STAY, (node, after, 0, 0))] if after else []
        left = nxt[0]
        code, length = _lead_bits(b, left), left + 1
    else:
        code, length = (code << 6) | (b & 0x3F), pend[1]
    if not nxt:
        after = regex.step(state, code)  # type: ignore[attr-defined]
        return [(STAY, (node, after, 0, 0))] if after else []
    bits = 6 * nxt[0]
    lo = max(code << bits, _UTF8_LOWEST[length])
    hi = min((code << bits) | ((1 << bits) - 1), _UTF8_HIGHEST[length])
    if lo > hi or not regex.can_step(state, lo, hi):  # type: ignore[attr-defined]
        return []
    return [(STAY, (node, state, (nxt, length), code))]


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


def utf8_prefix(raw: bytes) -> bool:
    """Whether ``raw`` is valid UTF-8 or a valid start of it (a character cut short)."""
    pending: Any = 0
    for b in raw:
        pending = utf8_next(pending, b)
        if pending is None:
            return False
    return True


def utf8_next(pending: Any, b: int) -> Any:
    """UTF-8's rule, a byte at a time: ``pending`` is 0 between characters, else (bytes still
    due, lowest and highest allowed next byte); None for a byte that cannot come here."""
    if pending:
        left, lo, hi = pending
        if not lo <= b <= hi:
            return None
        return 0 if left == 1 else (left - 1, 0x80, 0xBF)
    if b < 0x80:
        return 0
    if 0xC2 <= b <= 0xDF:
        return (1, 0x80, 0xBF)
    if b == 0xE0:  # no overlong forms
        return (2, 0xA0, 0xBF)
    if b == 0xED:  # no surrogates
        return (2, 0x80, 0x9F)
    if 0xE1 <= b <= 0xEF:
        return (2, 0x80, 0xBF)
    if b == 0xF0:
        return (3, 0x90, 0xBF)
    if 0xF1 <= b <= 0xF3:
        return (3, 0x80, 0xBF)
    if b == 0xF4:  # nothing past U+10FFFF
        return (3, 0x80, 0x8F)
    return None


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


# Any JSON value: one node of each kind, the containers made of any values again.
ANY_VALUE = Node(ANY)
ANY_OBJECT = obj((), ANY_VALUE)
_ANY_KINDS = (ANY_OBJECT, array(ANY_VALUE), string(), number(False), literal((b"true", b"false", b"null")))
FREE_STRING = string()  # a string's place with its bounds taken off (the masks' shortcut)
