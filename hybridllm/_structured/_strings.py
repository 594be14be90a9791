"""A string's bytes, one at a time: a JSON string within length bounds (``STR``), a string whose
text matches a pattern or format (``PAT``), plain text held to a regex (``RAW``), and the UTF-8
and escape rules they share.

Each stepper takes a top frame and a byte and returns the byte's outcomes, as ``_nodes.advance``
does (which dispatches here).
"""

from __future__ import annotations

from typing import Any

from ._graph import POP, STAY, Node

_ESCAPES = frozenset(b'"\\/bfnrtu')  # after a backslash (the short ones: _ESCAPED below, and u)
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPED = {0x22: 0x22, 0x5C: 0x5C, 0x2F: 0x2F, 0x62: 0x08, 0x66: 0x0C, 0x6E: 0x0A, 0x72: 0x0D, 0x74: 0x09}
_UTF8_LOWEST = {2: 0x80, 3: 0x800, 4: 0x10000}  # no overlong forms
_UTF8_HIGHEST = {2: 0x7FF, 3: 0xFFFF, 4: 0x10FFFF}


# What a \uXXXX escape may write: what JSON writers escape that way (control characters, the quote
# and the backslash, and what lies past ASCII: ensure_ascii). '9' written as \u0039 is valid JSON
# but no writer's: a model let into it spent its tokens on escapes (SmolLM2 wrote a date as
# "12\u00391\u002d1\u0032..." and ran out of tokens).
_ESCAPABLE = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0xFFFF))


def _escapable(lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of [lo, hi] a \\u escape may write."""
    return [(max(lo, a), min(hi, b)) for a, b in _ESCAPABLE if max(lo, a) <= min(hi, b)]


def _string(frame: tuple, b: int) -> list[tuple]:
    # A JSON string. Phases: 0 before '"', 1 between characters or inside a UTF-8 one (``utf``:
    # utf8_next's state), 2 after '\', 3 in \u's hex digits.
    node, phase, chars, hexes, utf = frame
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


def _lead_bits(b: int, left: int) -> int:
    """A UTF-8 lead byte's own bits of its code point (``left`` continuation bytes to come)."""
    return b & (0x1F if left == 1 else 0x0F if left == 2 else 0x07)


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
