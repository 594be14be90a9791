"""JSON Schema's ``pattern`` (an ECMA-262 regular expression, a subset) and ``format`` as an NFA
over code points, for the strings of a grammar (``_nodes.PAT``).

A state is a frozenset of the NFA's character-reading states (hashable: the token masks are
memoised on it). Supported: literals, ``.``, classes (``[a-z]``, ``[^...]``), ``\\d \\w \\s`` and
their negations, the usual escapes, groups (``(...)``, ``(?:...)``, ``(?<name>...)``), ``|``, the
quantifiers ``* + ? {n} {n,} {n,m}`` (lazy forms read as greedy: the language is the same) and
``^`` / ``$`` at the ends. Refused (a ``ValueError`` whose text says which): backreferences,
lookarounds, ``\\b``, anchors inside, flags. As JSON Schema says, a pattern is a search: without
``^`` any text may come before the match, without ``$`` any text after it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable

MAX_CODE = 0x10FFFF
MAX_REPEAT = 1000  # the largest bound a quantifier may give
MAX_STATES = 20_000  # the largest NFA a pattern may make
# the most (state, state reached without a character) pairs a pattern's closures may hold: a
# pattern of many optional parts in a row (``(a|b?){1000}``) makes them quadratic, and compiling
# one took 13 s; this many take about a tenth of a second
MAX_CLOSURE = 300_000

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
_SPACE: Ranges = _norm([(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                        (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000),
                        (0xFEFF, 0xFEFF)])
_DOT: Ranges = _negate(_norm([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]))  # no line terminators
_ANY: Ranges = ((0, MAX_CODE),)
_CLASS_ESCAPES = {"d": _DIGIT, "D": _negate(_DIGIT), "w": _WORD, "W": _negate(_WORD),
                  "s": _SPACE, "S": _negate(_SPACE)}
_CONTROL_ESCAPES = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D, "0": 0x00}


class _Nfa:
    """Thompson's construction: state i reads a character of ``chars[i]`` into ``next[i]``, or
    (``chars[i]`` None) moves without one to each of ``eps[i]``."""

    def __init__(self) -> None:
        self.chars: list[Ranges | None] = []
        self.next: list[int] = []
        self.eps: list[list[int]] = []

    def state(self) -> int:
        if len(self.chars) >= MAX_STATES:
            raise ValueError(f"the pattern is too large (over {MAX_STATES} states); simplify its repeats")
        self.chars.append(None)
        self.next.append(-1)
        self.eps.append([])
        return len(self.chars) - 1


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
        body = self.text[self.i + 1:end]
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
            hexes = self.text[self.i:self.i + digits]
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


def _build(nfa: _Nfa, node: tuple, start: int) -> int:
    """Add ``node``'s states after ``start``; return its end state."""
    kind = node[0]
    if kind == "set":
        end = nfa.state()
        if node[1]:  # an empty class matches nothing: no edge
            nfa.chars[start], nfa.next[start] = node[1], end
        return end
    if kind == "cat":
        at = start
        for part in node[1]:
            nxt = nfa.state()
            nfa.eps[at].append(nxt)
            at = _build(nfa, part, nxt)
        return at
    if kind == "alt":
        end = nfa.state()
        for part in node[1]:
            branch = nfa.state()
            nfa.eps[start].append(branch)
            nfa.eps[_build(nfa, part, branch)].append(end)
        return end
    _, part, lo, hi = node  # rep
    at = start
    for _ in range(lo):
        nxt = nfa.state()
        nfa.eps[at].append(nxt)
        at = _build(nfa, part, nxt)
    if hi is None:  # then any number more
        loop = nfa.state()
        nfa.eps[at].append(loop)
        body = nfa.state()
        nfa.eps[loop].append(body)
        nfa.eps[_build(nfa, part, body)].append(loop)
        return loop
    end = nfa.state()
    for _ in range(hi - lo):
        nfa.eps[at].append(end)
        nxt = nfa.state()
        nfa.eps[at].append(nxt)
        at = _build(nfa, part, nxt)
    nfa.eps[at].append(end)
    return end


class Regex:
    """A compiled pattern. ``start``: the state before the string's first character; ``step``:
    the state after a code point (empty: refused); ``accepts``: whether the string may end here;
    ``can_step``: whether some code point in a range leads on; ``shortest`` / ``longest``: the
    fewest and most characters from a state to a match's end (``inf``: no bound), which the
    grammar holds against minLength / maxLength. Only live states (those that can still reach a
    match) are kept, so a non-empty state can always be completed."""

    def __init__(self, pattern: str) -> None:
        if not isinstance(pattern, str):
            raise ValueError("a pattern must be a string")
        self.pattern = pattern
        body, head, tail = pattern, False, False
        if body.startswith("^"):
            body, head = body[1:], True
        if body.endswith("$") and not _escaped_end(body):
            body, tail = body[:-1], True
        parser = _Parser(body)
        tree = parser.alternation()
        if parser.i != len(body):
            raise parser.fail("an unmatched ')'")
        pad = ("rep", ("set", _ANY), 0, None)  # a search: any text around an unanchored match
        tree = ("cat", [*([] if head else [pad]), tree, *([] if tail else [pad])])
        nfa = _Nfa()
        first = nfa.state()
        accept = _build(nfa, tree, first)
        self._chars, self._accept = nfa.chars, accept
        budget = [MAX_CLOSURE]
        closure = [_closure(nfa, i, budget) for i in range(len(nfa.chars))]
        # the graph of positions: character-reading states and the accept state
        succ = {i: frozenset(j for j in closure[nfa.next[i]] if nfa.chars[j] is not None or j == accept)
                for i, c in enumerate(nfa.chars) if c is not None}
        succ[accept] = frozenset()
        self._shortest, self._longest = _distances(succ, accept)
        live = set(self._shortest)
        self._succ = {i: frozenset(j for j in nxt if j in live) for i, nxt in succ.items() if i in live}
        self.start = frozenset(j for j in closure[first]
                               if j in live and (nfa.chars[j] is not None or j == accept))
        if not self.start:
            raise ValueError("the pattern matches no string")
        self._steps: dict[tuple[frozenset, int], frozenset] = {}

    def step(self, state: frozenset, code: int) -> frozenset:
        key = (state, code)
        out = self._steps.get(key)
        if out is None:
            found: set[int] = set()
            for i in state:
                ranges = self._chars[i] if i != self._accept else None
                if ranges and _has(ranges, code):
                    found |= self._succ[i]
            out = frozenset(found)
            if len(self._steps) < 65536:
                self._steps[key] = out
        return out

    def step_within(self, state: frozenset, code: int, need: int, room: int | None) -> frozenset:
        """``step``, keeping only the states from which a match can end after at least ``need``
        and at most ``room`` (None: any number) more characters."""
        return frozenset(j for j in self.step(state, code) if self._fits(j, need, room))

    def can_step(self, state: frozenset, lo: int, hi: int, need: int = 0, room: int | None = None) -> bool:
        """Whether some code point in [lo, hi] leads on from ``state`` (within ``need`` / ``room``,
        as ``step_within``)."""
        for i in state:
            ranges = self._chars[i] if i != self._accept else None
            if ranges and _meets(ranges, lo, hi) and any(self._fits(j, need, room) for j in self._succ[i]):
                return True
        return False

    def fits(self, state: frozenset, need: int, room: int | None) -> bool:
        """Whether a match can end from ``state`` after ``need`` to ``room`` more characters."""
        return any(self._fits(j, need, room) for j in state)

    def _fits(self, j: int, need: int, room: int | None) -> bool:
        return (room is None or self._shortest[j] <= room) and self._longest[j] >= need

    def class_bounds(self) -> list[int]:
        """The code points where the pattern's character sets start or stop: code points between
        two neighbours are alike to it."""
        sets = [r for r in self._chars if r]
        cuts = {lo for r in sets for lo, _ in r} | {hi + 1 for r in sets for _, hi in r}
        return sorted(c for c in cuts if 0 < c <= MAX_CODE)

    def accepts(self, state: frozenset) -> bool:
        return self._accept in state

    def shortest(self, state: frozenset) -> int:
        return min(self._shortest[i] for i in state)

    def longest(self, state: frozenset) -> float:
        return max(self._longest[i] for i in state)


def _escaped_end(body: str) -> bool:
    """Whether the final '$' of ``body`` is escaped (an odd run of backslashes before it)."""
    run = len(body) - 1 - len(body[:-1].rstrip("\\"))
    return run % 2 == 1


def _closure(nfa: _Nfa, i: int, budget: list[int]) -> frozenset:
    """The states ``i`` reaches without reading a character (itself included)."""
    seen, todo = {i}, [i]
    while todo:
        for j in nfa.eps[todo.pop()]:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    budget[0] -= len(seen)
    if budget[0] < 0:
        raise ValueError("the pattern is too complex to serve (too many optional parts in a row); "
                         "simplify its repeats")
    return frozenset(seen)


def _distances(succ: dict[int, frozenset], accept: int) -> tuple[dict[int, int], dict[int, float]]:
    """Per position that can reach ``accept``: the fewest and the most characters on the way
    (each position but the accept state reads one); ``inf`` where a loop lies on some way."""
    pred: dict[int, list[int]] = {i: [] for i in succ}
    for i, nxt in succ.items():
        for j in nxt:
            pred[j].append(i)
    shortest = {accept: 0}
    frontier = [accept]
    while frontier:  # breadth first, backwards from the end: unit steps
        nxt_frontier = []
        for j in frontier:
            for i in pred[j]:
                if i not in shortest:
                    shortest[i] = shortest[j] + 1
                    nxt_frontier.append(i)
        frontier = nxt_frontier
    live = set(shortest)
    # longest: a live position on a live loop, or one that reaches such, has no bound; the rest
    # form a DAG, taken in reverse topological order
    comp = _components(live, succ, pred)
    size: dict[int, int] = {}
    for c in comp.values():
        size[c] = size.get(c, 0) + 1
    looped = {i for i in live if size[comp[i]] > 1 or i in succ[i]}
    unbounded = set(looped)
    todo = list(looped)
    while todo:
        for k in pred[todo.pop()]:
            if k in live and k not in unbounded:
                unbounded.add(k)
                todo.append(k)
    longest: dict[int, float] = {i: float("inf") for i in unbounded}
    rest = live - unbounded
    waiting = {i: sum(1 for j in succ[i] if j in rest) for i in rest}
    ready = [i for i, w in waiting.items() if w == 0]
    while ready:  # a position is done once every live successor is
        i = ready.pop()
        longest[i] = 0 if i == accept else max(longest[j] + 1 for j in succ[i] if j in live)
        for k in pred[i]:
            if k in rest:
                waiting[k] -= 1
                if waiting[k] == 0:
                    ready.append(k)
    return shortest, longest


def _components(live: set, succ: dict[int, frozenset], pred: dict[int, list[int]]) -> dict[int, int]:
    """Strongly connected components of the live positions (Kosaraju, without recursion)."""
    order: list[int] = []
    seen: set[int] = set()
    for root in live:
        if root in seen:
            continue
        seen.add(root)
        stack = [(root, iter([j for j in succ[root] if j in live]))]
        while stack:
            node, it = stack[-1]
            for j in it:
                if j not in seen:
                    seen.add(j)
                    stack.append((j, iter([k for k in succ[j] if k in live])))
                    break
            else:
                stack.pop()
                order.append(node)
    comp: dict[int, int] = {}
    for root in reversed(order):
        if root in comp:
            continue
        comp[root] = root
        todo = [root]
        while todo:
            for k in pred[todo.pop()]:
                if k in live and k not in comp:
                    comp[k] = root
                    todo.append(k)
    return comp


def _has(ranges: Ranges, code: int) -> bool:
    k = bisect_right(ranges, (code, MAX_CODE + 1)) - 1
    return k >= 0 and ranges[k][0] <= code <= ranges[k][1]


def _meets(ranges: Ranges, lo: int, hi: int) -> bool:
    k = bisect_right(ranges, (hi, MAX_CODE + 1)) - 1  # the last range starting at or below hi
    return k >= 0 and ranges[k][1] >= lo


# JSON Schema's ``format`` values served, each as the pattern a value of it must match
_DEC_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_FULL_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:(?:[0-5]\d|60)(?:\.\d{1,9})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_FULL_DATE = r"\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])"
_DURATION_TIME = r"T(?:\d+H(?:\d+M)?(?:\d+(?:\.\d+)?S)?|\d+M(?:\d+(?:\.\d+)?S)?|\d+(?:\.\d+)?S)"
FORMATS = {
    "date": f"^{_FULL_DATE}$",  # RFC 3339 full-date
    "time": f"^{_FULL_TIME}$",  # RFC 3339 full-time (with its offset)
    "date-time": f"^{_FULL_DATE}T{_FULL_TIME}$",
    "duration": (r"^P(?:(?:\d+Y(?:\d+M)?(?:\d+D)?|\d+M(?:\d+D)?|\d+D)(?:" + _DURATION_TIME + r")?|"
                 + _DURATION_TIME + r"|\d+W)$"),  # ISO 8601, as RFC 3339's appendix A
    "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "email": rf"^[A-Za-z0-9.!#$%&'*+/=?^_`{{|}}~-]{{1,64}}@{_LABEL}(?:\.{_LABEL})+$",
    "hostname": rf"^{_LABEL}(?:\.{_LABEL})*$",
    "ipv4": rf"^{_DEC_OCTET}(?:\.{_DEC_OCTET}){{3}}$",
    # a scheme, then no whitespace and none of the characters RFC 3986 never allows raw
    "uri": r'^[A-Za-z][A-Za-z0-9+.-]*:[^\s"<>\\^`{|}]+$',
}


def compiled(pattern: str) -> Regex:
    """``Regex(pattern)``, kept for the last 256 patterns: a pattern (a format's too) asked again,
    by any schema, is the same object, so a token index's groups for it serve them all."""
    found = _COMPILED.get(pattern)
    if found is None:
        found = Regex(pattern)  # a ValueError for a pattern outside the subset
        _COMPILED[pattern] = found
        while len(_COMPILED) > 256:
            _COMPILED.popitem(last=False)
    else:
        _COMPILED.move_to_end(pattern)
    return found


_COMPILED: OrderedDict[str, Regex] = OrderedDict()


def integer_range(lo: int | None, hi: int | None) -> str:
    """A pattern of the JSON integers in [lo, hi] (None: no bound), as JSON writes them: no
    leading zeros, no '-0'. Split by sign, then by digit count, then by leading digit, so each
    part is a run of fixed digits, one class and free digits: O(digits) parts a length."""
    parts: list[str] = []
    if hi is None or hi >= 0:
        parts += _natural_range(max(lo, 0) if lo is not None else 0, hi)
    if lo is None or lo < 0:
        # n < 0: '-' and |n| in [max(1, -hi), -lo]
        low_abs = max(1, -hi) if hi is not None else 1
        parts += ["-" + p for p in _natural_range(low_abs, -lo if lo is not None else None)]
    if not parts:
        raise ValueError("no integer lies within the bounds")
    return "^(?:" + "|".join(parts) + ")$"


def _natural_range(a: int, b: int | None) -> list[str]:
    """Patterns for a <= n <= b (n >= 0; b None: no bound)."""
    if b is not None and b < a:
        return []
    parts: list[str] = []
    top_len = len(str(b)) if b is not None else len(str(a))
    for length in range(len(str(a)), top_len + 1):
        first = 10 ** (length - 1) if length > 1 else 0
        last = 10 ** length - 1
        lo, hi = max(a, first), last if b is None else min(b, last)
        if lo <= hi:
            parts += _same_length(str(lo), str(hi))
    if b is None:  # every number longer than a's digits
        parts.append(f"[1-9]\\d{{{len(str(a))},}}")
    return parts


def _same_length(lo: str, hi: str) -> list[str]:
    """Patterns for the numbers from lo to hi, both written with the same number of digits."""
    if len(lo) == 1:
        return [f"[{lo}-{hi}]" if lo != hi else lo]
    if lo[0] == hi[0]:
        return [lo[0] + p for p in _same_length(lo[1:], hi[1:])]
    rest = len(lo) - 1
    parts: list[str] = []
    start, end = int(lo[0]), int(hi[0])
    if lo[1:] != "0" * rest:  # lo .. lo[0]99..9
        parts += [lo[0] + p for p in _same_length(lo[1:], "9" * rest)]
        start += 1
    tail_full = hi[1:] == "9" * rest
    if not tail_full:
        end -= 1
    if start <= end:  # whole decades: a leading digit, then any digits
        parts.append((f"[{start}-{end}]" if start != end else str(start)) + f"\\d{{{rest}}}")
    if not tail_full:  # hi[0]00..0 .. hi
        parts += [hi[0] + p for p in _same_length("0" * rest, hi[1:])]
    return parts


def number_range(lo: tuple[int, bool] | None, hi: tuple[int, bool] | None) -> str:
    """A pattern of the JSON numbers within whole-number bounds, each (bound, inclusive) or None,
    written as JSON writes them but without an exponent (the bounds are read off the digits):
    an integer part, then perhaps a fraction. Negative numbers are '-' and y = -x > 0, so
    both sides are one rule on a positive part y with its own bounds."""
    parts: list[str] = []
    if hi is None or hi[0] > 0 or (hi[0] == 0 and hi[1]):  # x >= 0
        low = (0, True) if lo is None or lo[0] < 0 else lo
        parts += _unsigned_range(low, hi)
    if lo is None or lo[0] < 0:  # x < 0: y = -x, y > 0
        low = (-hi[0], hi[1]) if hi is not None and hi[0] < 0 else (0, False)
        high = (-lo[0], lo[1]) if lo is not None else None
        parts += ["-" + p for p in _unsigned_range(low, high)]
    if not parts:
        raise ValueError("no number lies within the bounds")
    return "^(?:" + "|".join(parts) + ")$"


_ANY_FRACTION = r"(?:\.\d+)?"
_ZERO_FRACTION = r"(?:\.0+)?"
_SOME_FRACTION = r"\.\d*[1-9]\d*"


def _unsigned_range(low: tuple[int, bool], high: tuple[int, bool] | None) -> list[str]:
    """Patterns for l <(=) y <(=) h, y >= 0 an integer part and an optional fraction: the whole
    parts strictly inside take any fraction, a bound's own whole part only the fractions that
    keep y on the right side of it (none past h, a non-zero one past an exclusive l)."""
    lo, lo_in = low
    first_any = lo if lo_in else lo + 1  # whole parts from here take any fraction
    last_any = None if high is None else high[0] - 1  # ... up to here
    parts: list[str] = []

    def whole(a: int, b: int | None) -> str:
        return "(?:" + "|".join(_natural_range(a, b)) + ")"

    if last_any is None or first_any <= last_any:
        parts.append(whole(first_any, last_any) + _ANY_FRACTION)
    if not lo_in and (high is None or lo < high[0]):  # lo itself, with a fraction above zero
        parts.append(whole(lo, lo) + _SOME_FRACTION)
    if high is not None and high[1] and (high[0] > lo or (high[0] == lo and lo_in)):
        parts.append(whole(high[0], high[0]) + _ZERO_FRACTION)  # h itself, no fraction past it
    return parts
