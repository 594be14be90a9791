"""The matcher over an output's bytes, and which tokens of a vocabulary it allows next."""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from . import _nodes as n
from ._strings import utf8_prefix

_MEMO_SIZE = 2048  # masks kept per index (bit-packed: vocabulary / 8 bytes each)
_PATTERN_GROUPS = 16  # patterns whose token groups an index keeps (TokenIndex._in_pattern: int32 ids,
# about 4 bytes a token each), more when one prepared grammar has more, up to:
_PATTERN_GROUPS_MAX = 256


class Matcher:
    """Where an output stands in its grammar, fed with the output's bytes as they come."""

    __slots__ = ("_states",)

    def __init__(self, states: frozenset) -> None:
        self._states = states

    # an auto answer's CallsMatcher has both too: free between its calls, its call's matcher in one
    free = False  # every token allowed (no mask), never here

    def held_by(self) -> Matcher:
        """The matcher whose mask applies now: this one."""
        return self

    def feed(self, data: bytes) -> bool:
        """Advance over ``data``; False, and nothing moved, if it breaks the grammar."""
        states = _feed(self._states, data)
        if not states:
            return False
        self._states = states
        return True

    def accepts(self, data: bytes) -> bool:
        return bool(_feed(self._states, data))

    @property
    def done(self) -> bool:
        """A whole value is out: the output may end here."""
        return any(n.can_end(s) for s in self._states)

    @property
    def finished(self) -> bool:
        """A whole value is out and nothing may follow it: only the end may come."""
        return all(len(s) == 1 and s[0][1] == 1 for s in self._states)

    def copy(self) -> Matcher:
        return Matcher(self._states)

    @property
    def key(self) -> frozenset:
        return self._states


def _feed(states: frozenset, data: bytes) -> frozenset:
    for b in data:
        out: set = set()
        for s in states:
            n.step(s, b, out)
        if not out:
            return frozenset()
        states = frozenset(out)
    return states


class TokenIndex:
    """A vocabulary, read once, for the masks of the tokens a matcher allows next.

    The tokens are kept sorted by their bytes, so a range of them shares a prefix: a mask walks
    that implicit trie, feeding each distinct prefix once and dropping a whole range at the first
    byte the grammar refuses. Inside a free string every token of a string's own bytes is allowed
    as it is; only those with a quote or a backslash are walked.
    """

    def __init__(self, token_bytes: Sequence[bytes | None], eos_ids: Iterable[int],
                 shown: Mapping[int, bytes] | None = None) -> None:
        self.vocab_size = len(token_bytes)
        # markers (None above: never a grammar's) whose text an answer's free text still shows
        # (Qwen's <tool_call>, in the cloud engine's vocabulary): an auto tools answer reads them
        self._shown = {int(i): bytes(t) for i, t in (shown or {}).items()}
        self.eos_ids = sorted({int(i) for i in eos_ids if 0 <= int(i) < self.vocab_size})
        self._eos = np.zeros(self.vocab_size, dtype=bool)
        self._eos[self.eos_ids] = True
        eos = set(self.eos_ids)
        pairs = sorted((t, i) for i, t in enumerate(token_bytes) if t and i not in eos)
        self._toks = [t for t, _ in pairs]
        self._ids = np.array([i for _, i in pairs], dtype=np.int64)
        self._bytes: list[bytes | None] = list(token_bytes)
        # Inside a string (between characters, no escape open), a token is one of:
        # - plain: a string's own bytes (no quote, backslash or control byte) forming whole
        #   characters and perhaps the start of one more: allowed as it is (UTF-8 state aside);
        # - quoted: whole characters, then a quote closing the string, then a tail the context
        #   rules on (one walk per distinct tail, from any string state of that context);
        # - escaped: a backslash among its bytes, read whole from the state (few of them);
        # - anything else (a control byte, a stray continuation byte) never fits.
        n_vocab = self.vocab_size
        self._plain = np.zeros(n_vocab, dtype=bool)
        self._quoted = np.zeros(n_vocab, dtype=bool)
        self._chars = np.zeros(n_vocab, dtype=np.int64)  # characters before any quote
        tails: dict[bytes, list[int]] = {}
        escaped: dict[bytes, list[int]] = {}
        for t, i in pairs:
            cut = _first_special(t)
            head = t if cut is None else t[:cut]
            whole = _utf8(head)
            if not whole and (cut is not None or not utf8_prefix(head)):
                continue
            self._chars[i] = sum(1 for b in head if not 0x80 <= b < 0xC0)
            if cut is None:
                self._plain[i] = True
            elif t[cut] == 0x22:
                self._quoted[i] = True
                tails.setdefault(t[cut:], []).append(i)
            elif t[cut] == 0x5C:
                escaped.setdefault(t, []).append(i)
        self._tails = [(tail, np.array(ids, dtype=np.int64)) for tail, ids in tails.items()]
        self._escaped = [(t, np.array(ids, dtype=np.int64)) for t, ids in escaped.items()]
        self._memo: OrderedDict[Any, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._groups: OrderedDict[Any, tuple[list, np.ndarray]] = OrderedDict()
        self._group_limit = _PATTERN_GROUPS
        self._texts: list[tuple[int, str]] | None = None  # whole-character plain tokens' text
        self._raw_texts: list[tuple[int, str]] | None = None  # every whole-character token's text
        self._free: np.ndarray | None = None

    def allowed(self, matcher: Matcher) -> np.ndarray:
        """Per token id: whether it may come next (end-of-output ids once the value is whole).
        An auto answer's ``CallsMatcher``: every token in its free text (one shared array,
        ``free``), its call's mask inside a call."""
        if matcher.free:
            return self.free
        matcher = matcher.held_by()
        key = matcher.key
        with self._lock:
            packed = self._memo.get(key)
            if packed is not None:
                self._memo.move_to_end(key)
        if packed is not None:
            return np.unpackbits(packed, count=self.vocab_size).astype(bool)
        mask = self._compute(matcher)
        with self._lock:
            self._memo[key] = np.packbits(mask)
            if len(self._memo) > _MEMO_SIZE:
                self._memo.popitem(last=False)
        return mask

    def feed_token(self, matcher: Matcher, token_id: int) -> bool:
        """Advance ``matcher`` over a sampled token (an end-of-output id changes nothing)."""
        if 0 <= token_id < self.vocab_size and self._eos[token_id]:
            return matcher.done
        data = self._bytes[token_id] if 0 <= token_id < self.vocab_size else None
        if matcher.free:  # an auto answer's free text: any token
            return matcher.feed(data or self._shown.get(token_id, b""))
        return bool(data) and matcher.feed(data)  # type: ignore[arg-type]

    @property
    def free(self) -> np.ndarray:
        """Every token allowed (an auto answer's free text); one array, shared: do not write it."""
        if self._free is None:
            self._free = np.ones(self.vocab_size, dtype=bool)
            self._free.flags.writeable = False
        return self._free

    def _compute(self, matcher: Matcher) -> np.ndarray:
        mask = np.zeros(self.vocab_size, dtype=bool)
        if matcher.done:
            mask |= self._eos
        if matcher.finished:
            return mask
        states = matcher.key
        if len(states) == 1:
            (only,) = states
            room = n.string_room(only)
            if room is not None:
                return mask | self._in_string(only, *room)
            if n.in_pattern(only):
                return mask | self._in_pattern(only)
            place = n.raw_place(only)
            if place is not None:
                return mask | self._in_raw(place)
        hits: list[int] = []
        self._walk(states, 0, len(self._toks), 0, hits)
        if hits:
            mask[self._ids[hits]] = True
        return mask

    def _in_string(self, state: tuple, need: int, room: int | None) -> np.ndarray:
        """The mask inside a string, from its length bounds: ``need`` characters still due before
        the quote, at most ``room`` more (None: no bound)."""
        if room is None and need <= 0:
            mask = self._plain.copy()
            for tail, ids in self._tails:
                if _feed(frozenset((state,)), tail):
                    mask[ids] = True
        else:
            # the tails' verdicts are the free string's of this context (memoised), the bounds
            # are the quoted tokens' character counts
            free = self.allowed(Matcher(frozenset((n.unbounded(state),))))
            fits = np.ones(self.vocab_size, dtype=bool) if room is None else self._chars <= room
            mask = (self._plain & fits) | (self._quoted & free & fits & (self._chars >= need))
        for token, ids in self._escaped:
            if _feed(frozenset((state,)), token):
                mask[ids] = True
        return mask

    def _in_pattern(self, state: tuple) -> np.ndarray:
        """The mask inside a pattern's string, between characters. A regex tells apart only the
        classes of code points its character sets cut out, so the whole-character plain tokens
        are grouped by their text's class sequence (built once per pattern): each group is run
        through the regex once, on one code point per class, groups sharing a prefix sharing its
        steps. The rest (a quote, a backslash, a character cut short) are fed one by one."""
        node, _, chars, _, rstate, _ = state[-1]
        regex, lo, hi = node.a, node.b, node.c
        groups, others = self._pattern_groups(regex)

        def advance(j: int, rs: frozenset, code: int) -> frozenset:
            c = chars + j  # characters before this one
            room = None if hi is None else hi - c - 1
            return regex.step_within(rs, code, lo - c - 1, room) if room is None or room >= 0 else frozenset()

        return self._through_groups(state, rstate, groups, others, advance)

    def _in_raw(self, state: tuple) -> np.ndarray:
        """The mask of a plain-text regex (vLLM's structured_outputs regex), between characters:
        as ``_in_pattern``, over every token that is whole UTF-8 text (a quote, a backslash, a
        control character are characters like any other here); tokens that cut a character
        short are fed one by one."""
        _, rstate, _, _ = state[-1]
        regex = state[-1][0].a
        groups, others = self._pattern_groups(regex, raw=True)
        return self._through_groups(state, rstate, groups, others, lambda _j, rs, code: regex.step(rs, code))

    def _through_groups(self, state: tuple, rstate: frozenset, groups: list, others: np.ndarray,
                        advance: Any) -> np.ndarray:
        """Each group of tokens run through the regex from ``rstate`` once (``advance(j, state,
        code)``: the state after the j-th character), groups sharing a prefix sharing its steps;
        ``others`` fed from the grammar state one by one."""
        mask = np.zeros(self.vocab_size, dtype=bool)
        prev: tuple = ()
        stack = [rstate]  # stack[j]: the regex's state after j characters of prev (empty: refused)
        for reps, ids in groups:
            k = 0
            limit = min(len(prev), len(reps), len(stack) - 1)
            while k < limit and prev[k] == reps[k]:
                k += 1
            del stack[k + 1:]
            while len(stack) <= len(reps) and stack[-1]:
                stack.append(advance(len(stack) - 1, stack[-1], reps[len(stack) - 1]))
            if len(stack) == len(reps) + 1 and stack[-1]:
                mask[ids] = True
            prev = reps
        start = frozenset((state,))
        for i in others:
            if _feed(start, self._bytes[i]):  # type: ignore[arg-type]
                mask[i] = True
        return mask

    def prepare(self, grammar: Any) -> None:
        """Do now, ahead of the first mask, the per-pattern work a grammar's strings need (a pass
        over the vocabulary each: a fraction of a second for a large one), e.g. off a serving
        loop's thread."""
        regexes = grammar.regexes()
        with self._lock:  # a schema of many patterns keeps them all (else its masks rebuild them)
            self._group_limit = max(self._group_limit, min(len(regexes), _PATTERN_GROUPS_MAX))
        raw = grammar.kind == "regex"  # a plain-text regex: its tokens are grouped as text
        for regex in regexes:
            self._pattern_groups(regex, raw)

    def _pattern_groups(self, regex: Any, raw: bool = False) -> tuple[list, np.ndarray]:
        """(groups of whole-character tokens by their class sequence, the tokens fed one by one)
        for a pattern inside a JSON string, or (``raw``) for plain text."""
        key = (regex, raw)
        with self._lock:
            found = self._groups.get(key)
            if found is not None:
                self._groups.move_to_end(key)
                return found
        texts = self._whole_texts(raw)
        bounds = regex.class_bounds()
        reps_of = [0, *bounds]  # a class's first code point stands for it
        by_reps: dict[tuple, list[int]] = {}
        for i, text in texts:
            by_reps.setdefault(tuple(reps_of[bisect_right(bounds, ord(ch))] for ch in text), []).append(i)
        groups = [(reps, np.array(ids, dtype=np.int32)) for reps, ids in sorted(by_reps.items())]
        whole = np.zeros(self.vocab_size, dtype=bool)
        whole[[i for i, _ in texts]] = True
        if raw:  # every other token with bytes: a character cut short, or a stray byte
            others = np.setdiff1d(self._ids, np.flatnonzero(whole))
        else:
            others = np.flatnonzero((self._plain & ~whole) | self._quoted)
            others = np.union1d(others, np.concatenate([ids for _, ids in self._escaped] or [others[:0]]))
        found = (groups, others)
        with self._lock:
            self._groups[key] = found
            while len(self._groups) > self._group_limit:
                self._groups.popitem(last=False)
        return found

    def _whole_texts(self, raw: bool) -> list[tuple[int, str]]:
        """(token id, text) of the tokens that are whole UTF-8 text: a string's plain ones, or
        (``raw``) any but the end-of-output ids."""
        texts = self._raw_texts if raw else self._texts
        if texts is None:
            texts = []
            for tid in (self._ids.tolist() if raw else np.flatnonzero(self._plain).tolist()):
                try:
                    texts.append((tid, self._bytes[tid].decode("utf-8")))  # type: ignore[union-attr]
                except UnicodeDecodeError:
                    pass
            if raw:
                self._raw_texts = texts
            else:
                self._texts = texts
        return texts

    def _walk(self, states: frozenset, lo: int, hi: int, depth: int, hits: list[int]) -> None:
        # self._toks[lo:hi] share their first ``depth`` bytes, which led to ``states``
        toks = self._toks
        i = lo
        while i < hi and len(toks[i]) == depth:  # tokens that end here (sorted first)
            hits.append(i)
            i += 1
        if i < hi and all(n.is_free_string(s) for s in states):
            self._walk_string(states, i, hi, depth, hits)
            return
        while i < hi:
            c = toks[i][depth]
            j = bisect_left(toks, toks[i][:depth] + bytes((c + 1,)), i, hi) if c < 255 else hi
            out: set = set()
            for s in states:
                n.step(s, c, out)
            if out:
                self._walk(frozenset(out), i, j, depth + 1, hits)
            i = j

    def _walk_string(self, states: frozenset, lo: int, hi: int, depth: int, hits: list[int]) -> None:
        # inside a free string the string's own bytes change nothing: each token is read from
        # its first quote or backslash (a control byte ends it)
        toks = self._toks
        for i in range(lo, hi):
            t = toks[i]
            cut = _first_special(t, depth)
            if cut is None and _utf8(t[depth:]):
                hits.append(i)
            elif cut is None or t[cut] in (0x22, 0x5C):
                if not _utf8(t[depth:cut]):
                    cut = depth
                if _feed(states, t[cut:]):
                    hits.append(i)


def _utf8(t: bytes) -> bool:
    try:
        t.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _first_special(t: bytes, start: int = 0) -> int | None:
    for k in range(start, len(t)):
        b = t[k]
        if b < 0x20 or b == 0x22 or b == 0x5C:
            return k
    return None
