"""Which replica serves a request: a router that thinks in tokens (plain data, no Ray, no torch).

Each replica reports (through Ray Serve's ``record_routing_stats``, every fraction of a second)
its outstanding work in tokens, prompt tokens still to prefill plus decode tokens still expected,
and the chained hashes of the prefix blocks its KV cache holds. Reports are stale by up to one
period, so the router also keeps its own books: the tokens of the requests it has sent and not yet
seen finish, and the prompt blocks it has sent to each replica (those will be cached there).

The choice, for a prompt whose full blocks hash to ``h_1..h_n`` (the engine's own chain, so equal
hashes mean equal whole prefixes):

    match(r) = the longest i such that h_1..h_i are all held by (or were sent to) replica r
    load(r)  = max(reported outstanding tokens, tokens of the requests we sent and that are open)
    held(r)  = prefix blocks replica r holds or was sent (how full its cache is)
    best     = argmax match(r), ties broken by the lower load, then by the fewer held blocks
    least    = argmin load(r), ties broken by the longer match, then by the fewer held blocks
    if match(best) > 0 and load(best) <= load(least) + margin: send to best
    else: send to least

    margin = max(min_margin_tokens, imbalance_ratio * load(least))
             + prefill_weight * block_size * (match(best) - match(least))

The second term is the prefill the cache saves, weighted (``prefill_weight``, 1.0 by default):
sending the request elsewhere costs its whole prompt's prefill there, which on a CPU replica takes
about as long as the same number of decode tokens and delays the request's first token directly,
and it puts the prefix into a second cache, where it evicts another tenant's prefix (whose next
request then pays its own prefill). On a GPU, where prefill is cheap beside decode steps, a
smaller weight spills sooner.

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

from ..engine.block_manager import chain_hash

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
    reported_hashes: frozenset[int] = frozenset()
    reported_at: float = 0.0
    open_requests: dict[str, int] = field(default_factory=dict)  # request id -> tokens
    sent_hashes: OrderedDict[int, float] = field(default_factory=OrderedDict)  # hash -> sent at

    @property
    def sent_tokens(self) -> int:
        return sum(self.open_requests.values())

    def load(self) -> int:
        return max(self.reported_tokens, self.sent_tokens)

    def holds(self, h: int) -> bool:
        return h in self.reported_hashes or h in self.sent_hashes

    def num_held(self) -> int:
        """Prefix blocks the replica reported or was sent (how full its cache is, roughly)."""
        return len(self.reported_hashes) + sum(1 for h in self.sent_hashes if h not in self.reported_hashes)


@dataclass(frozen=True)
class Choice:
    replica: ReplicaKey
    reason: str  # "prefix" or "least-tokens"
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
        max_sent_hashes: int = 8192,
        sent_ttl_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if block_size < 1 or imbalance_ratio < 0 or min_margin_tokens < 0:
            raise ValueError("block_size >= 1, imbalance_ratio >= 0, min_margin_tokens >= 0")
        self.block_size = block_size
        self.imbalance_ratio = imbalance_ratio
        self.prefill_weight = prefill_weight
        self.min_margin_tokens = min_margin_tokens
        self.max_sent_hashes = max_sent_hashes
        self.sent_ttl_s = sent_ttl_s
        self._clock = clock
        self.books: dict[ReplicaKey, ReplicaBooks] = {}
        self._request_replica: dict[str, ReplicaKey] = {}
        self.num_prefix_choices = 0
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

    def on_report(self, replica: ReplicaKey, stats: dict | None) -> None:
        """A replica's routing stats: ``outstanding_tokens`` and ``prefix_hashes``."""
        if not stats:
            return
        books = self.books.setdefault(replica, ReplicaBooks())
        books.reported_tokens = int(stats.get("outstanding_tokens", 0))
        books.reported_hashes = frozenset(stats.get("prefix_hashes", ()))
        books.reported_at = now = self._clock()
        # a block we sent long ago that the replica no longer reports was evicted there
        for h, sent_at in list(books.sent_hashes.items()):
            if now - sent_at < self.sent_ttl_s:
                break  # oldest first: the rest are younger
            if h not in books.reported_hashes:
                del books.sent_hashes[h]

    # -- the decision --------------------------------------------------------------------------
    def choose(self, candidates: Sequence[ReplicaKey], prompt_hashes: Sequence[int]) -> Choice:
        if not candidates:
            raise ValueError("no candidate replicas")
        books = [self.books.setdefault(c, ReplicaBooks()) for c in candidates]
        loads = [b.load() for b in books]
        matches = [self._match(b, prompt_hashes) for b in books]
        held = [b.num_held() for b in books]
        best = max(range(len(candidates)), key=lambda i: (matches[i], -loads[i], -held[i]))
        least = min(range(len(candidates)), key=lambda i: (loads[i], -matches[i], held[i]))
        saved = self.prefill_weight * self.block_size * (matches[best] - matches[least])
        margin = max(self.min_margin_tokens, self.imbalance_ratio * loads[least]) + saved
        if matches[best] > 0 and loads[best] <= loads[least] + margin:
            self.num_prefix_choices += 1
            return Choice(candidates[best], "prefix", matches[best])
        self.num_load_choices += 1
        return Choice(candidates[least], "least-tokens", matches[least])

    @staticmethod
    def _match(books: ReplicaBooks, prompt_hashes: Sequence[int]) -> int:
        n = 0
        for h in prompt_hashes:
            if not books.holds(h):
                break
            n += 1
        return n

    # -- our own books -------------------------------------------------------------------------
    def on_sent(
        self, replica: ReplicaKey, request_id: str, prompt_hashes: Sequence[int], num_tokens: int
    ) -> None:
        self.on_done(request_id)  # a request routed again (a retry) counts once
        books = self.books.setdefault(replica, ReplicaBooks())
        books.open_requests[request_id] = num_tokens
        self._request_replica[request_id] = replica
        now = self._clock()
        for h in prompt_hashes:
            books.sent_hashes[h] = now
            books.sent_hashes.move_to_end(h)
        while len(books.sent_hashes) > self.max_sent_hashes:
            books.sent_hashes.popitem(last=False)

    def on_done(self, request_id: str) -> None:
        replica = self._request_replica.pop(request_id, None)
        if replica is not None and replica in self.books:
            self.books[replica].open_requests.pop(request_id, None)


def estimate_tokens(num_prompt_tokens: int, matched_blocks: int, block_size: int, max_tokens: int) -> int:
    """A request's outstanding work in tokens: prompt tokens it must prefill plus its decode."""
    return max(0, num_prompt_tokens - matched_blocks * block_size) + max_tokens
