"""A pattern's text read into a tree, ECMA-262's syntax (the subset ``_regex`` describes): code
point ranges and the classes, escapes and quantifiers that make them.
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_CODE = 0x10FFFF
MAX_REPEAT = 1000  # the largest bound a quantifier may give

Ranges = tuple[tuple[int, int], ...]  # sorted, disjoint, inclusive code point ranges


def _norm(ranges: Iterable[tuple[int, int]]) -> Ranges:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _negate(ranges: Ranges) -> Ranges:
    out, at = [], 0
    for lo, hi in ranges:
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= MAX_CODE:
        out.append((at, MAX_CODE))
    return tuple(out)


_DIGIT: Ranges = ((0x30, 0x39),)
_WORD: Ranges = _norm([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
# ECMA-262's WhiteSpace and LineTerminator
_SPACE: Ranges = _norm(
    [
        (0x09, 0x0D),
        (0x20, 0x20),
        (0xA0, 0xA0),
        (0x1680, 0x1680),
        (0x2000, 0x200A),
        (0x2028, 0x2029),
        (0x202F, 0x202F),
        (0x205F, 0x205F),
        (0x3000, 0x3000),
        (0xFEFF, 0xFEFF),
    ]
)
_DOT: Ranges = _negate(_norm([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]))  # no line terminators
_ANY: Ranges = ((0, MAX_CODE),)
_CLASS_ESCAPES = {
    "d": _DIGIT,
    "D": _negate(_DIGIT),
    "w": _WORD,
    "W": _negate(_WORD),
    "s": _SPACE,
    "S": _negate(_SPACE),
}
_CONTROL_ESCAPES = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D, "0": 0x00}


# A parsed pattern: ("set", ranges) | ("cat", [parts]) | ("alt", [parts]) | ("rep", part, lo, hi|None)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.i = text, 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{what} (at character {self.i} of the pattern)")

    def peek(self) -> str | None:
        return self.text[self.i] if self.i < len(self.text) else None

    def take(self) -> str:
        ch = self.text[self.i]
        self.i += 1
        return ch

    def alternation(self) -> tuple:
        parts = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            parts.append(self.sequence())
        return parts[0] if len(parts) == 1 else ("alt", parts)

    def sequence(self) -> tuple:
        items: list[tuple] = []
        while self.peek() not in (None, "|", ")"):
            items.append(self.quantified())
        return ("cat", items)

    def quantified(self) -> tuple:
        atom = self.atom()
        while True:
            ch = self.peek()
            if ch == "*":
                lo, hi = 0, None
            elif ch == "+":
                lo, hi = 1, None
            elif ch == "?":
                lo, hi = 0, 1
            elif ch == "{" and self._braces() is not None:
                lo, hi = self._braces()  # type: ignore[misc]
                self.i = self.text.index("}", self.i)
            else:
                return atom
            self.i += 1
            if self.peek() == "?":  # lazy: the same strings
                self.i += 1
            if (hi if hi is not None else lo) > MAX_REPEAT:
                raise self.fail(f"a repeat above {MAX_REPEAT} is not supported")
            if hi is not None and hi < lo:
                raise self.fail("a repeat's upper bound is below its lower bound")
            atom = ("rep", atom, lo, hi)

    def _braces(self) -> tuple[int, int | None] | None:
        end = self.text.find("}", self.i)
        if end < 0:
            return None
        body = self.text[self.i + 1 : end]
        lo, comma, hi = body.partition(",")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None  # a literal '{', as ECMA-262's Annex B reads it
        return int(lo), (int(hi) if hi else None) if comma else int(lo)

    def atom(self) -> tuple:
        ch = self.take()
        if ch == "(":
            if self.text.startswith("?:", self.i):
                self.i += 2
            elif self.text.startswith("?<", self.i) and not self.text.startswith(("?<=", "?<!"), self.i):
                end = self.text.find(">", self.i)
                if end < 0:
                    raise self.fail("an unclosed group name")
                self.i = end + 1
            elif self.peek() == "?":
                raise self.fail("lookarounds and group flags are not supported")
            inner = self.alternation()
            if self.peek() != ")":
                raise self.fail("an unclosed group")
            self.i += 1
            return inner
        if ch == "[":
            return ("set", self._class())
        if ch == ".":
            return ("set", _DOT)
        if ch == "\\":
            return ("set", self._escape(in_class=False))
        if ch in "^$":
            raise self.fail(f"'{ch}' is supported only at the pattern's {'start' if ch == '^' else 'end'}")
        if ch in "*+?":
            raise self.fail(f"'{ch}' has nothing to repeat")
        if ch == ")":
            raise self.fail("an unmatched ')'")
        return ("set", ((ord(ch), ord(ch)),))

    def _class(self) -> Ranges:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            if self.peek() is None:
                raise self.fail("an unclosed '['")
            if self.peek() == "]" and not first:
                self.i += 1
                break
            first = False
            if self.peek() == "]":  # ECMA-262: '[]' matches nothing, '[^]' anything
                self.i += 1
                break
            lo = self._class_atom()
            if self.peek() == "-" and self.i + 1 < len(self.text) and self.text[self.i + 1] != "]":
                self.i += 1
                hi = self._class_atom()
                if len(lo) != 1 or len(hi) != 1 or lo[0][0] != lo[0][1] or hi[0][0] != hi[0][1]:
                    raise self.fail("a class range needs a single character at each end")
                if hi[0][0] < lo[0][0]:
                    raise self.fail("a class range out of order")
                ranges.append((lo[0][0], hi[0][0]))
            else:
                ranges.extend(lo)
        out = _norm(ranges)
        return _negate(out) if negated else out

    def _class_atom(self) -> Ranges:
        ch = self.take()
        if ch == "\\":
            return self._escape(in_class=True)
        return ((ord(ch), ord(ch)),)

    def _escape(self, in_class: bool) -> Ranges:
        if self.peek() is None:
            raise self.fail("a pattern cannot end with '\\'")
        ch = self.take()
        if ch in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[ch]
        if ch in _CONTROL_ESCAPES and not (ch == "0" and (self.peek() or "").isdigit()):
            code = _CONTROL_ESCAPES[ch]
        elif ch == "b" and in_class:
            code = 0x08
        elif ch in "xu":
            digits = 2 if ch == "x" else 4
            hexes = self.text[self.i : self.i + digits]
            if len(hexes) != digits or any(c not in "0123456789abcdefABCDEF" for c in hexes):
                raise self.fail(f"'\\{ch}' needs {digits} hex digits")
            self.i += digits
            code = int(hexes, 16)
        elif ch.isdigit():
            raise self.fail("backreferences are not supported")
        elif ch in "bB":
            raise self.fail("word boundaries (\\b, \\B) are not supported")
        elif ch.isalnum():
            raise self.fail(f"the escape '\\{ch}' is not supported")
        else:  # an escaped punctuation character is itself
            code = ord(ch)
        return ((code, code),)
