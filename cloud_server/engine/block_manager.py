"""Paged KV-cache bookkeeping: reference-counted blocks and prefix caching (no torch).

The pool has ``num_blocks`` blocks of ``block_size`` token slots. A sequence owns a block table;
blocks are taken on demand as its tokens are computed, never reserved for ``max_tokens``.

Prefix caching: once a block is full and computed, it is registered under a chained hash
``h_i = H(h_{i-1}, tokens of block i)``, so equal hashes mean equal whole prefixes. A new
sequence whose leading full blocks hash the same shares those blocks (ref count + 1) instead of
recomputing them. A block whose ref count drops to 0 keeps its hash and contents and waits in one
of two LRU lists; it is reused for a prefix hit, or evicted (hash dropped) only when fresh blocks
run out, least recently freed first. Blocks that never held a full block are handed out before any
cached one is evicted.

Eviction, two classes (as a radix tree frees leaves before the prefixes they hang from):

    once:   cached blocks no prefix hit has used yet (answers, one-off questions)
    reused: blocks that served at least one prefix hit (shared system prompts, few-shot headers);
            a preempted sequence taking its own blocks back is no hit by another request
    evict:  the least recently freed "once" block; a "reused" one only when no "once" block is left
    bound:  free "reused" blocks hold at most 4/5 of the pool; past it the least recent one goes
            back to the newest end of "once" (so old conversations cannot fill the cache for good)

So a long answer's blocks never push out a system prompt that other requests keep using.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict, deque

from ..exceptions import EngineError
from .sequence import Sequence

# the first block's parent: a fixed int, not None (Python 3.11 hashes None by its address, which
# differs between processes; a cluster router compares its hashes with a replica's)
_ROOT_HASH = 0x6879627269646C6C


def chain_hash(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """A signed 64-bit BLAKE2b digest of the parent's hash and the block's tokens, the same in
    every process. Not Python's ``hash``: a tuple hashes its int items modulo 2**61 - 1, so two
    parents that differ by a multiple of it gave every child the same hash, and its unsalted,
    invertible arithmetic makes prompts whose chains meet another's cached prefix cheap to search
    for (a block's own tokens are compared, its parents' are not): they took KV computed for it."""
    parent = _ROOT_HASH if parent_hash is None else parent_hash
    data = struct.pack(f"<q{len(token_ids)}q", parent, *token_ids)  # fixed byte order: any host
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise EngineError("BlockManager needs at least one block of at least one slot")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self._block_hash: list[int | None] = [None] * num_blocks
        self._block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._hash_to_block: dict[int, int] = {}
        # the draft model's KV pool (same block ids) holds this block's final tokens too
        self._draft_ready = [False] * num_blocks
        self._fresh: deque[int] = deque(range(num_blocks))  # free, holding nothing reusable
        # free but cached, least recently freed first: blocks no hit has used, and ones one has
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._evictable_reused: OrderedDict[int, None] = OrderedDict()
        self._reused = [False] * num_blocks
        # the sequence whose step computed (and registered) the block: its own comeback after a
        # preemption takes it back through the prefix cache, which is no hit by another request
        self._block_owner: list[int | None] = [None] * num_blocks
        self._max_free_reused = max(1, num_blocks * 4 // 5)
        # prompt tokens looked up, and of which found in the cache: once per request (see
        # count_prefix_lookup), so they agree with the requests' own cached-token counts
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # -- counts ------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._fresh) + len(self._evictable) + len(self._evictable_reused)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._hash_to_block)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def cached_block_hashes(self) -> list[int]:
        """Hashes of the full blocks the prefix cache holds (in use or evictable), read-only."""
        return list(self._hash_to_block)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- prefix cache ------------------------------------------------------------------------
    def allocate_prefix(self, seq: Sequence, *, count: bool = True) -> int:
        """Give a sequence with no blocks the cached blocks of its longest cached prefix.

        At least one token is left to compute, so the step that follows yields logits and never
        writes into a shared block. Returns the number of tokens served from the cache.
        ``count=False``: leave the counters alone; the scheduler, which may look a request up
        again every step while it waits for blocks, counts it once itself (count_prefix_lookup).
        """
        if seq.block_table:
            raise EngineError(f"{seq!r} already has blocks")
        for block, h in self._prefix_hits(seq):
            self._acquire(block)
            if self._block_owner[block] != seq.seq_id:  # shared with another request
                self._reused[block] = True
            seq.block_table.append(block)
            seq.block_hashes.append(h)
        num_cached = len(seq.block_table) * self.block_size
        seq.num_computed_tokens = num_cached
        if count:
            self.count_prefix_lookup(seq.num_tokens, num_cached)
        return num_cached

    def _prefix_hits(self, seq: Sequence) -> list[tuple[int, int]]:
        """(block, chain hash) of the cached blocks of ``seq``'s longest cached prefix, taking
        nothing: full blocks only, leaving the last token to compute."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        hits: list[tuple[int, int]] = []
        parent: int | None = None
        for i in range((seq.num_tokens - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(parent, tokens)
            block = self._hash_to_block.get(h)
            if block is None or self._block_tokens[block] != tokens:
                break
            hits.append((block, h))
            parent = h
        return hits

    def blocks_to_admit(self, seq: Sequence) -> tuple[int, int]:
        """For a sequence with no blocks: (new blocks its whole prompt needs beyond its cached
        prefix, free blocks left once that prefix is taken), without taking anything: the
        scheduler's admission check, which leaves the LRU order and the blocks' classes alone."""
        hits = self._prefix_hits(seq)
        idle = sum(self.ref_counts[block] == 0 for block, _ in hits)  # free now, taken by the hit
        return self.num_blocks_for(seq.num_tokens) - len(hits), self.num_free_blocks - idle

    def count_prefix_lookup(self, num_tokens: int, num_cached: int) -> None:
        """Record one request's lookup: ``num_tokens`` prompt tokens, ``num_cached`` of them hits."""
        self.prefix_cache_queries += num_tokens
        self.prefix_cache_hits += num_cached

    def _acquire(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            self._evictable.pop(block, None)
            self._evictable_reused.pop(block, None)
        self.ref_counts[block] += 1

    # -- allocation --------------------------------------------------------------------------
    def num_new_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = self.num_blocks_for(seq.num_computed_tokens + num_new_tokens)
        return max(0, total - len(seq.block_table))

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_new_blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        """Make the block table cover ``num_computed_tokens + num_new_tokens`` tokens."""
        needed = self.num_new_blocks_needed(seq, num_new_tokens)
        if needed > self.num_free_blocks:
            raise EngineError(f"out of KV blocks for {seq!r} (check can_append first)")
        for _ in range(needed):
            seq.block_table.append(self._take_free_block())

    def _take_free_block(self) -> int:
        if self._fresh:
            block = self._fresh.popleft()
        else:  # the least recently freed block no hit has used, else the least recent reused one
            pool = self._evictable if self._evictable else self._evictable_reused
            block, _ = pool.popitem(last=False)
            h = self._block_hash[block]
            if h is not None and self._hash_to_block.get(h) == block:
                del self._hash_to_block[h]
            self._block_hash[block] = None
            self._block_tokens[block] = None
        self.ref_counts[block] = 1
        self._reused[block] = False
        self._block_owner[block] = None
        self._draft_ready[block] = False  # new contents: the draft's old keys no longer match
        return block

    def commit(self, seq: Sequence) -> None:
        """Register the sequence's newly full, computed blocks in the prefix cache."""
        bs = self.block_size
        num_full = min(seq.num_computed_tokens // bs, len(seq.block_table))
        parent = seq.block_hashes[-1] if seq.block_hashes else None
        for i in range(len(seq.block_hashes), num_full):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(parent, tokens)
            seq.block_hashes.append(h)
            parent = h
            if not self.enable_prefix_caching:
                continue
            block = seq.block_table[i]
            if h not in self._hash_to_block and self._block_hash[block] is None:
                self._hash_to_block[h] = block
                self._block_hash[block] = h
                self._block_tokens[block] = tokens
                self._block_owner[block] = seq.seq_id

    # -- the draft model's copy of the cache -------------------------------------------------
    def mark_draft_ready(self, seq: Sequence) -> None:
        """Record that the draft's KV pool holds the sequence's full blocks of final tokens (the
        tokens below both its target and its draft progress), for later prefix hits."""
        done = min(seq.num_draft_computed_tokens, seq.num_computed_tokens) // self.block_size
        # called every drafting step: walk back from the newest full block to the ready ones
        # before it (a held block is never reset, so the ready blocks of a table lead it)
        for block in reversed(seq.block_table[: min(done, len(seq.block_hashes))]):
            if self._draft_ready[block]:
                break
            self._draft_ready[block] = True

    def draft_cached_tokens(self, seq: Sequence) -> int:
        """Leading tokens of the sequence whose draft keys and values are already in the draft
        pool (prefix-hit blocks another sequence's draft computed); at least one token is left."""
        n = 0
        for block in seq.block_table[: len(seq.block_hashes)]:
            if not self._draft_ready[block]:
                break
            n += 1
        return max(0, min(n * self.block_size, seq.num_computed_tokens, seq.num_tokens - 1))

    def trim(self, seq: Sequence) -> None:
        """Release the blocks past ``seq.num_computed_tokens`` (rejected speculative tokens).

        Tail blocks that no longer hold a computed token go back to the pool, and hashes of
        blocks that are no longer full and computed are forgotten by the sequence (a block is
        registered in the prefix cache only by ``commit``, after the trim, so a cached block
        never holds a rejected token).
        """
        keep = self.num_blocks_for(seq.num_computed_tokens)
        for block in reversed(seq.block_table[keep:]):
            self._release(block)
        del seq.block_table[keep:]
        self.uncommit(seq)

    def uncommit(self, seq: Sequence) -> None:
        """Forget the hashes of the sequence's blocks that are no longer full and computed (a
        failed step rolled back), and the prefix-cache entries ``commit`` made for those it
        still holds: its retry may write other tokens there."""
        num_full = seq.num_computed_tokens // self.block_size
        for block in seq.block_table[num_full:]:  # a rolled-back step's draft record too
            self._draft_ready[block] = False
        for block, h in zip(seq.block_table[num_full:], seq.block_hashes[num_full:], strict=False):
            if self._block_hash[block] == h and self._hash_to_block.get(h) == block:
                del self._hash_to_block[h]
                self._block_hash[block] = None
                self._block_tokens[block] = None
        del seq.block_hashes[num_full:]

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] < 0:
            raise EngineError(f"block {block} freed twice")
        if self.ref_counts[block] == 0:
            if self._block_hash[block] is None:
                self._fresh.append(block)
            elif self._reused[block]:
                self._evictable_reused[block] = None
                if len(self._evictable_reused) > self._max_free_reused:
                    old, _ = self._evictable_reused.popitem(last=False)
                    self._reused[old] = False
                    self._evictable[old] = None
            else:
                self._evictable[block] = None

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references; the tail goes first so it is evicted first."""
        for block in reversed(seq.block_table):
            self._release(block)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached block that no sequence holds (for cold-cache measurements)."""
        for block in [*self._evictable, *self._evictable_reused]:
            h = self._block_hash[block]
            if h is not None:
                self._hash_to_block.pop(h, None)
            self._block_hash[block] = None
            self._block_tokens[block] = None
            self._draft_ready[block] = False
            self._reused[block] = False
            self._block_owner[block] = None
            self._fresh.append(block)
        self._evictable.clear()
        self._evictable_reused.clear()
