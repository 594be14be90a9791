"""Which replica serves a request: a router that thinks in tokens (plain data, no Ray, no torch).

Each replica reports (through Ray Serve's ``record_routing_stats``, every fraction of a second)
its outstanding work in tokens, prompt tokens still to prefill plus decode tokens still expected,
and the chained hashes of the prefix blocks its KV cache holds. Reports are stale by up to one
period, so the router also keeps its own books: the tokens of the requests it has sent and not yet
seen finish, and the prompt blocks it has sent to each replica (those will be cached there).

The choice, for a prompt whose full blocks hash to ``h_1..h_n`` (the engine's own chain, so equal
hashes mean equal whole prefixes):

    match(r)    = the longest i such that h_1..h_i are all held by (or were sent to) replica r
    load(r)     = max(reported outstanding tokens, tokens of the requests we sent and that are open)
    pressure(r) = prompt tokens r still has to prefill (its report, plus the requests sent since)
                  + decode_weight * decode tokens still expected there
    held(r)     = prefix blocks replica r holds or was sent (how full its cache is)
    best        = argmax match(r), ties broken by the lower load, then by the fewer held blocks
    least       = argmin load(r), ties broken by the longer match, then by the fewer held blocks
    if match(best) > 0 and pressure(best) <= pressure(least) + margin: send to best ("prefix")
    elif match(best) > 0: send to least ("spill")
    elif the prompt's prefix was sent before to one replica more deeply than to any other (its
         home, where memory pressure evicted it) and that replica is within the margin: send
         there ("home"), so a tenant's requests keep their partition of the fleet
    else: send to least ("least-tokens")

    margin = max(min_margin_tokens, imbalance_ratio * pressure(least))
             + prefill_weight * block_size * (match(best) - match(least))

Why pressure and not load for the overload test: a new request's first token waits for the prompt
tokens queued ahead of it and for its own prefill; the decode tokens of running answers do not
queue ahead of it (each step runs every running sequence's next token and the new prompt's chunk
together), they only fill the batch and slow its steps, so they count at ``decode_weight`` (0.5).
The second term of the margin is the prefill the cache saves, weighted (``prefill_weight``, 1.0):
sending the request elsewhere costs its whole prompt's prefill there, which delays its first
token directly, and it puts the prefix into a second cache, where it evicts another tenant's
prefix (whose next request then pays its own prefill). Balance between replicas (where a new
prompt goes) stays in outstanding tokens, prefill and decode alike.

So a tenant's long system prompt keeps going to the replica that has it cached until that replica
is busier than the least busy one by more than the margin; then the request spills to the least
loaded replica (which then caches the prefix too). A prompt cached nowhere (a new tenant) goes to
the least loaded replica and, among equally loaded ones, to the one whose cache holds the fewest
blocks, so tenants spread over the caches instead of piling into the first. A short common prefix
(a one-block default system prompt) buys little margin, so such requests spread by load.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine.block_manager import chain_hash
from .fleet import finite_number

ReplicaKey = Hashable


def prompt_block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the prompt's full blocks, as the engine's prefix cache computes them
    (the last token is always computed, so a prompt of exactly n blocks looks up n - 1)."""
    out: list[int] = []
    parent: int | None = None
    for i in range((len(token_ids) - 1) // block_size):
        parent = chain_hash(parent, tuple(token_ids[i * block_size : (i + 1) * block_size]))
        out.append(parent)
    return out


@dataclass
class ReplicaBooks:
    """What the router knows about one replica."""

    reported_tokens: int = 0
    reported_prefill: int = 0
    reported_decode: int = 0
    reported_hashes: frozenset[int] = frozenset()
    reported_at: float = 0.0
    # request id -> (prompt tokens to prefill, decode tokens expected, sent at)
    open_requests: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    sent_hashes: OrderedDict[int, float] = field(default_factory=OrderedDict)  # hash -> sent at
    # every prompt block ever sent here (bounded, oldest dropped): where a tenant lives, even
    # after its blocks were evicted; hash -> sent at
    history: OrderedDict[int, float] = field(default_factory=OrderedDict)

    @property
    def sent_tokens(self) -> int:
        return sum(p + d for p, d, _ in self.open_requests.values())

    def load(self) -> int:
        return max(self.reported_tokens, self.sent_tokens)

    def pressure(self, decode_weight: float, window_s: float = 1.0) -> float:
        """What delays a new request's first token here: prompt tokens still to prefill (as
        reported, plus those of requests sent since the report) and, weighted, decode tokens.
        A report is seen when the router next looks, up to a period after the replica wrote it:
        requests sent within ``window_s`` before it count as not in it yet (at worst twice)."""
        since = self.reported_at - window_s
        fresh = sum(p for p, _, t in self.open_requests.values() if t >= since)
        decode = max(self.reported_decode, sum(d for _, d, _ in self.open_requests.values()))
        return self.reported_prefill + fresh + decode_weight * decode

    def holds(self, h: int) -> bool:
        return h in self.reported_hashes or h in self.sent_hashes

    def num_held(self) -> int:
        """Prefix blocks the replica reported or was sent (how full its cache is, roughly)."""
        return len(self.reported_hashes) + sum(1 for h in self.sent_hashes if h not in self.reported_hashes)


@dataclass(frozen=True)
class Choice:
    replica: ReplicaKey
    # "prefix"; "spill" (cached elsewhere, but that replica is overloaded); "home" (cached nowhere,
    # sent to where this prefix went before); "least-tokens"
    reason: str
    matched_blocks: int


class TokenAwareRouter:
    """The routing decision and its books; the Ray Serve ``RequestRouter`` is a thin shell."""

    def __init__(
        self,
        *,
        block_size: int = 16,
        imbalance_ratio: float = 0.25,
        min_margin_tokens: int = 128,
        prefill_weight: float = 1.0,
        decode_weight: float = 0.5,
        max_sent_hashes: int = 8192,
        max_history: int = 16384,
        sent_ttl_s: float = 10.0,
        report_ttl_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if block_size < 1 or imbalance_ratio < 0 or min_margin_tokens < 0:
            raise ValueError("block_size >= 1, imbalance_ratio >= 0, min_margin_tokens >= 0")
        self.block_size = block_size
        self.imbalance_ratio = imbalance_ratio
        self.prefill_weight = prefill_weight
        self.decode_weight = decode_weight
        self.min_margin_tokens = min_margin_tokens
        self.max_sent_hashes = max_sent_hashes
        self.max_history = max_history
        self.sent_ttl_s = sent_ttl_s
        self.report_ttl_s = report_ttl_s
        self._clock = clock
        self.books: dict[ReplicaKey, ReplicaBooks] = {}
        self._request_replica: dict[str, ReplicaKey] = {}
        self._routed: dict[str, ReplicaKey] = {}  # request -> the replica Serve says took it
        self._ended: OrderedDict[str, ReplicaKey] = OrderedDict()  # recent attempts that ended
        # request -> (replica, sent at, the prompt blocks its booking first put in that replica's
        # sent blocks, in its history): taken back when the request does not run there
        self._added: OrderedDict[str, tuple[ReplicaKey, float, list[int], list[int]]] = OrderedDict()
        self.num_prefix_choices = 0  # per request (a request routed again counts once)
        self.num_spill_choices = 0
        self.num_home_choices = 0
        self.num_load_choices = 0

    # -- what the replicas say -----------------------------------------------------------------
    def sync_replicas(self, replicas: Iterable[ReplicaKey]) -> None:
        """Keep books for exactly these replicas (a dead one's open requests are forgotten)."""
        live = set(replicas)
        for key in list(self.books):
            if key not in live:
                for rid in self.books.pop(key).open_requests:
                    self._request_replica.pop(rid, None)
        for key in live:
            self.books.setdefault(key, ReplicaBooks())
        self.expire_reports()

    def expire_reports(self) -> None:
        """A replica that stopped reporting (its stats call fails or times out) keeps its last
        report no longer than ``report_ttl_s``: then its load is our own books alone, not figures
        from long ago that would keep the router avoiding (or piling onto) it. Its prefix hashes
        stay: a replica's cache does not change while it runs nothing."""
        now = self._clock()
        for books in self.books.values():
            if now - books.reported_at > self.report_ttl_s:
                books.reported_tokens = books.reported_prefill = books.reported_decode = 0
                # and no report covers any request sent there: pressure() counts the prefill of
                # every open one (else those sent before the last report counted nowhere, and a
                # replica whose stats time out under its backlog looked idle to the prefix rule)
                books.reported_at = float("-inf")

    def on_report(self, replica: ReplicaKey, stats: dict | None) -> None:
        """A replica's routing stats: ``outstanding_tokens`` and ``prefix_hashes``."""
        if not stats:
            return
        books = self.books.setdefault(replica, ReplicaBooks())
        # a figure that is no count (NaN, None, negative) reads as 0, our own books then carry the
        # replica's load: it must neither fail every routing call nor make a replica look idler
        # than idle (a negative pressure would draw every prompt, and shrink the others' margin)
        books.reported_tokens = _count(stats.get("outstanding_tokens", 0))
        books.reported_prefill = _count(stats.get("prefill_tokens", 0))
        decode = stats.get("decode_tokens", books.reported_tokens - books.reported_prefill)
        books.reported_decode = _count(decode)
        try:
            books.reported_hashes = frozenset(stats.get("prefix_hashes", ()))
        except TypeError:  # None or no collection: no prefix known there
            books.reported_hashes = frozenset()
        books.reported_at = now = self._clock()
        # a block we sent long ago that the replica no longer reports was evicted there
        for h, sent_at in list(books.sent_hashes.items()):
            if now - sent_at < self.sent_ttl_s:
                break  # oldest first: the rest are younger
            if h not in books.reported_hashes:
                del books.sent_hashes[h]
        # a replica that says it has no work runs none of the requests sent to it well before
        # (``sent_ttl_s``): one still on our books lost its end (Serve calls no end for a request
        # cancelled between its choice and its send), and would keep the replica busy for ever
        raw = stats.get("outstanding_tokens")
        if raw == 0 and not isinstance(raw, bool):
            for rid in [r for r, (_, _, t) in books.open_requests.items() if now - t >= self.sent_ttl_s]:
                if self._request_replica.get(rid) == replica:
                    self.on_done(rid)
                else:
                    del books.open_requests[rid]

    # -- the decision --------------------------------------------------------------------------
    def choose(self, candidates: Sequence[ReplicaKey], prompt_hashes: Sequence[int]) -> Choice:
        if not candidates:
            raise ValueError("no candidate replicas")
        self.expire_reports()
        books = [self.books.setdefault(c, ReplicaBooks()) for c in candidates]
        loads = [b.load() for b in books]
        matches = [_leading(prompt_hashes, b.holds) for b in books]
        held = [b.num_held() for b in books]
        best = max(range(len(candidates)), key=lambda i: (matches[i], -loads[i], -held[i]))
        least = min(range(len(candidates)), key=lambda i: (loads[i], -matches[i], held[i]))
        if matches[best] == 0:
            # cached nowhere: back to the prefix's home, the one replica it was sent to before
            # (evicted there under memory pressure), so tenants keep their partition instead of
            # moving into, and evicting from, another replica's cache
            homes = [_leading(prompt_hashes, b.history.__contains__) for b in books]
            home = max(range(len(candidates)), key=lambda i: homes[i])
            if homes[home] > 0 and homes.count(homes[home]) == 1 and (  # one home, not a tie
                home == least or self._within_margin(books[home], books[least], homes[home])
            ):
                return Choice(candidates[home], "home", 0)
            return Choice(candidates[least], "least-tokens", matches[least])
        if best == least or self._within_margin(books[best], books[least], matches[best] - matches[least]):
            return Choice(candidates[best], "prefix", matches[best])
        return Choice(candidates[least], "spill", matches[least])

    def _within_margin(self, preferred: ReplicaBooks, least: ReplicaBooks, blocks: int) -> bool:
        """Is ``preferred`` (worth ``blocks`` prefix blocks to this request) not overloaded?"""
        p_pref, p_least = preferred.pressure(self.decode_weight), least.pressure(self.decode_weight)
        saved = self.prefill_weight * self.block_size * blocks
        return p_pref <= p_least + max(self.min_margin_tokens, self.imbalance_ratio * p_least) + saved

    # -- our own books -------------------------------------------------------------------------
    def on_sent(
        self,
        replica: ReplicaKey,
        request_id: str,
        prompt_hashes: Sequence[int],
        num_tokens: int,
        *,
        prefill_tokens: int = 0,
        reason: str | None = None,
    ) -> None:
        """``num_tokens`` of work (of which ``prefill_tokens`` prompt tokens to prefill) sent."""
        again = request_id in self._request_replica
        self._withdraw(request_id)  # booked again: it did not run where it was booked before
        self.on_done(request_id)  # a request routed again (a retry) counts once
        if not again and reason is not None:
            if reason == "prefix":
                self.num_prefix_choices += 1
            elif reason == "spill":
                self.num_spill_choices += 1
            elif reason == "home":
                self.num_home_choices += 1
            else:
                self.num_load_choices += 1
        books = self.books.setdefault(replica, ReplicaBooks())
        now = self._clock()
        prefill = min(prefill_tokens, num_tokens)
        books.open_requests[request_id] = (prefill, num_tokens - prefill, now)
        self._request_replica[request_id] = replica
        self._added[request_id] = (replica, now, [h for h in prompt_hashes if not books.holds(h)],
                                   [h for h in prompt_hashes if h not in books.history])
        while len(self._added) > 4096:
            self._added.popitem(last=False)
        for h in prompt_hashes:
            books.sent_hashes[h] = now
            books.sent_hashes.move_to_end(h)
        while len(books.sent_hashes) > self.max_sent_hashes:
            books.sent_hashes.popitem(last=False)
        for h in prompt_hashes:
            books.history[h] = now
            books.history.move_to_end(h)
        while len(books.history) > self.max_history:
            books.history.popitem(last=False)

    def on_routed(
        self,
        replica: ReplicaKey,
        request_id: str,
        prompt_hashes: Sequence[int],
        num_prompt_tokens: int,
        max_tokens: int,
    ) -> None:
        """Serve tries our ranks in order: a request the chosen replica turned away (its queue
        full) runs on a later rank's replica. Its work and prompt blocks go on the books of the
        replica that took it, and only the end of the attempt there closes it."""
        booked = self._request_replica.get(request_id)
        if booked is None and self._ended.get(request_id) == replica:
            return  # the attempt there has already ended: nothing to book
        if booked != replica:
            books = self.books.setdefault(replica, ReplicaBooks())
            matched = _leading(prompt_hashes, books.holds)
            tokens = estimate_tokens(num_prompt_tokens, matched, self.block_size, max_tokens)
            self.on_sent(replica, request_id, prompt_hashes, tokens, prefill_tokens=tokens - max_tokens)
        self._routed[request_id] = replica

    def on_done(self, request_id: str, replica: ReplicaKey | None = None) -> None:
        """``replica``: where the attempt that ended ran. The end of an attempt a replica turned
        away leaves the booking of the replica that took the request alone."""
        routed = self._routed.get(request_id)
        if replica is not None:
            self._ended[request_id] = replica
            self._ended.move_to_end(request_id)
            while len(self._ended) > 4096:
                self._ended.popitem(last=False)
            if routed is not None and routed != replica:
                return
        if replica is None or routed == replica:  # it ran there: its blocks are there (else
            self._added.pop(request_id, None)  # a replica turning it away ends it before on_routed)
        self._routed.pop(request_id, None)
        booked = self._request_replica.pop(request_id, None)
        if booked is not None and booked in self.books:
            self.books[booked].open_requests.pop(request_id, None)

    def on_cancelled(self, request_id: str) -> None:
        """The request was cancelled before it was sent to a replica: it ran nowhere."""
        self._withdraw(request_id)
        self.on_done(request_id)

    def _withdraw(self, request_id: str) -> None:
        """Take back the prompt blocks the request's booking put on a replica that never got it
        (it turned the request away, or it was cancelled first): else that replica looked as if
        it held the prefix, drawing the tenant's next requests there, and as its home too (tied
        with the replica that ran it: the tenant had no home any more). A block sent there since
        by another request stays."""
        added = self._added.pop(request_id, None)
        books = self.books.get(added[0]) if added is not None else None
        if added is None or books is None:
            return
        _, at, sent, history = added
        for h in sent:
            if books.sent_hashes.get(h) == at:
                del books.sent_hashes[h]
        for h in history:
            if books.history.get(h) == at:
                del books.history[h]


def estimate_tokens(num_prompt_tokens: int, matched_blocks: int, block_size: int, max_tokens: int) -> int:
    """A request's outstanding work in tokens: prompt tokens it must prefill plus its decode."""
    return max(0, num_prompt_tokens - matched_blocks * block_size) + max_tokens


# a token count no replica reaches (exact as a float): a larger report is taken as this, so a
# replica reporting an absurd load is avoided, and the margin's float math never overflows
MAX_COUNT = 2**53


def _count(value: Any) -> int:
    """A reported token count: a finite number >= 0 (a bool is no count), else 0; at most
    ``MAX_COUNT``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return min(max(0, value), MAX_COUNT)
    return min(max(0, int(value)), MAX_COUNT) if finite_number(value) else 0


def _leading(prompt_hashes: Sequence[int], has: Callable[[int], bool]) -> int:
    """How many of the prompt's blocks, from the first, ``has`` accepts (the prefix match)."""
    n = 0
    for h in prompt_hashes:
        if not has(h):
            break
        n += 1
    return n
