"""JSON Schema's ``pattern`` (an ECMA-262 regular expression, a subset) and ``format`` as an NFA
over code points, for the strings of a grammar (``_nodes.PAT``).

A state is a frozenset of the NFA's character-reading states (hashable: the token masks are
memoised on it). Supported: literals, ``.``, classes (``[a-z]``, ``[^...]``), ``\\d \\w \\s`` and
their negations, the usual escapes, groups (``(...)``, ``(?:...)``, ``(?<name>...)``), ``|``, the
quantifiers ``* + ? {n} {n,} {n,m}`` (lazy forms read as greedy: the language is the same) and
``^`` / ``$`` at the ends. Refused (a ``ValueError`` whose text says which): backreferences,
lookarounds, ``\\b``, anchors inside, flags. As JSON Schema says, a pattern is a search: without
``^`` any text may come before the match, without ``$`` any text after it.

The pattern is read by ``_regex_syntax`` into a tree, built into an NFA and measured by
``_regex_nfa``; here the compiled automaton the grammar steps. The patterns the grammar writes
itself (the formats, the numbers within bounds) are ``_patterns``'.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict

from ._patterns import FORMATS as FORMATS  # re-exported: the tests read them here
from ._patterns import integer_range as integer_range
from ._patterns import number_range as number_range
from ._regex_nfa import MAX_CLOSURE, _build, _closure, _distances, _Nfa
from ._regex_syntax import _ANY, MAX_CODE, Ranges, _Parser


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


def _has(ranges: Ranges, code: int) -> bool:
    k = bisect_right(ranges, (code, MAX_CODE + 1)) - 1
    return k >= 0 and ranges[k][0] <= code <= ranges[k][1]


def _meets(ranges: Ranges, lo: int, hi: int) -> bool:
    k = bisect_right(ranges, (hi, MAX_CODE + 1)) - 1  # the last range starting at or below hi
    return k >= 0 and ranges[k][1] >= lo


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
