"""Block manager on plain data: allocation, prefix hits, LRU eviction, no leaks."""

from __future__ import annotations

import pytest

from cloud_server.engine.block_manager import BlockManager
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.sequence import Sequence
from cloud_server.exceptions import EngineError

BS = 4


def make_seq(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(rid, tokens, SamplingParams(max_tokens=4))


def compute(bm: BlockManager, seq: Sequence, n: int) -> None:
    """What a step does: allocate slots, 'compute' n tokens, register full blocks."""
    bm.append_slots(seq, n)
    seq.num_computed_tokens += n
    bm.commit(seq)


@pytest.fixture
def bm():
    manager = BlockManager(8, BS)
    yield manager
    # no leaks: every test must leave every block free
    assert manager.num_free_blocks == manager.num_blocks
    assert all(r == 0 for r in manager.ref_counts)


def test_allocates_on_demand_not_for_max_tokens(bm):
    seq = make_seq(list(range(5)))
    assert bm.allocate_prefix(seq) == 0
    compute(bm, seq, 5)
    assert len(seq.block_table) == 2  # ceil(5 / 4), nothing reserved for outputs
    seq.append_token(99)
    compute(bm, seq, 1)
    assert len(seq.block_table) == 2
    for t in (100, 101, 102):
        seq.append_token(t)
        compute(bm, seq, 1)
    assert len(seq.block_table) == 3
    assert bm.num_used_blocks == 3
    bm.free(seq)


def test_prefix_hit_shares_blocks_and_leaves_a_token_to_compute(bm):
    a = make_seq(list(range(10)), "a")
    bm.allocate_prefix(a)
    compute(bm, a, 10)  # blocks: [0..3] [4..7] [8, 9]
    b = make_seq(list(range(8)) + [50, 51, 52], "b")
    assert bm.allocate_prefix(b) == 8
    assert b.block_table == a.block_table[:2]
    assert bm.ref_counts[a.block_table[0]] == 2
    # a prompt that is exactly two cached blocks still computes its last token
    c = make_seq(list(range(8)), "c")
    assert bm.allocate_prefix(c) == 4
    assert bm.prefix_cache_hits == 12
    for s in (a, b, c):
        bm.free(s)


def test_freed_cached_blocks_are_reused_for_hits(bm):
    a = make_seq(list(range(9)), "a")
    bm.allocate_prefix(a)
    compute(bm, a, 9)
    cached = a.block_table[:2]
    bm.free(a)
    assert bm.num_cached_blocks == 2  # still cached while free
    b = make_seq(list(range(9)), "b")
    assert bm.allocate_prefix(b) == 8
    assert b.block_table == cached
    bm.free(b)


def test_lru_eviction_prefers_fresh_then_least_recent(bm):
    a = make_seq(list(range(8)), "a")
    bm.allocate_prefix(a)
    compute(bm, a, 8)
    b = make_seq(list(range(100, 108)), "b")
    bm.allocate_prefix(b)
    compute(bm, b, 8)
    bm.free(a)  # a's blocks freed first: least recently used
    bm.free(b)
    assert bm.num_cached_blocks == 4
    c = make_seq(list(range(200, 216)), "c")
    bm.allocate_prefix(c)
    compute(bm, c, 16)  # takes the 4 fresh blocks, no eviction yet
    assert bm.num_cached_blocks == 8 and bm.num_free_blocks == 4
    d = make_seq(list(range(300, 304)) + [1], "d")
    bm.allocate_prefix(d)
    compute(bm, d, 5)  # needs 2 blocks: evicts a's (tail first), b stays cached
    assert bm.num_cached_blocks == 8 - 2 + 1  # d's first block is full and cached
    e = make_seq(list(range(100, 108)) + [7], "e")
    assert bm.allocate_prefix(e) == 8
    f = make_seq(list(range(8)) + [7], "f")
    assert bm.allocate_prefix(f) == 0
    for s in (c, d, e, f):
        bm.free(s)


def test_a_shared_prefix_outlives_later_one_off_blocks(bm):
    """A system prompt that served a hit is evicted after blocks no hit used, even ones freed later
    (plain LRU would evict the prompt first: it was freed before the long answer)."""
    system = list(range(500, 508))  # 2 blocks
    a = make_seq(system + [1], "a")
    bm.allocate_prefix(a)
    compute(bm, a, 9)
    b = make_seq(system + [2], "b")
    assert bm.allocate_prefix(b) == 8  # the prompt served a hit: reused
    compute(bm, b, 1)
    bm.free(a)
    bm.free(b)
    answer = make_seq(list(range(600, 616)), "answer")  # a one-off: 4 blocks, freed after the prompt
    bm.allocate_prefix(answer)
    compute(bm, answer, 16)
    bm.free(answer)
    fill = make_seq(list(range(700, 708)) + [3], "fill")  # needs 3 blocks: 2 fresh... then evicts
    bm.allocate_prefix(fill)
    compute(bm, fill, 9)
    again = make_seq(system + [4], "again")
    assert bm.allocate_prefix(again) == 8  # the prompt is still cached; the answer went first
    for seq in (fill, again):
        bm.free(seq)


def test_free_reused_blocks_are_bounded():
    """Reused blocks cannot hold the whole pool: past 4/5 of it the least recent goes back to the
    one-off class, so a long-gone conversation is evicted before the newer shared prefixes."""
    bm = BlockManager(12, BS)  # at most 9 free reused blocks
    prefixes = [list(range(100 * (k + 1), 100 * (k + 1) + 4)) for k in range(10)]
    for k, prefix in enumerate(prefixes):  # ten 1-block prefixes, each served one hit
        first = make_seq(prefix + [1], f"p{k}")
        bm.allocate_prefix(first)
        compute(bm, first, 5)
        second = make_seq(prefix + [2], f"q{k}")
        assert bm.allocate_prefix(second) == 4
        compute(bm, second, 1)
        bm.free(first)
        bm.free(second)
        assert len(bm._evictable_reused) <= 9
    assert len(bm._evictable_reused) == 9 and len(bm._evictable) == 1  # prefix 0, demoted
    fresh = len(bm._fresh)
    big = make_seq(list(range(5000, 5000 + 4 * (fresh + 1))), "big")
    bm.allocate_prefix(big)
    compute(bm, big, 4 * (fresh + 1))  # one block past the fresh ones: the demoted prefix 0
    for k, prefix in enumerate(prefixes):
        probe = make_seq(prefix + [3], f"probe{k}")
        assert bm.allocate_prefix(probe) == (0 if k == 0 else 4), k
        bm.free(probe)
    bm.free(big)
    assert bm.num_free_blocks == bm.num_blocks


def test_out_of_blocks_and_double_free_are_errors(bm):
    a = make_seq(list(range(40)), "a")
    assert not bm.can_append(a, 40)
    with pytest.raises(EngineError):
        bm.append_slots(a, 40)
    bm.append_slots(a, 8)
    bm.free(a)
    a.block_table = [0]
    with pytest.raises(EngineError):
        bm.free(a)
    bm.ref_counts[0] = 0  # undo the deliberate double free (block 0 is still in the pool)


def test_disabled_prefix_caching_never_hits():
    bm = BlockManager(4, BS, enable_prefix_caching=False)
    a = make_seq(list(range(9)), "a")
    bm.allocate_prefix(a)
    compute(bm, a, 9)
    bm.free(a)
    b = make_seq(list(range(9)), "b")
    assert bm.allocate_prefix(b) == 0
    bm.free(b)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 0


def test_draft_keys_of_prefix_hit_blocks_are_reused_until_the_block_is_rewritten(bm):
    """The draft model's pool shares the block ids: a prefix hit on blocks whose final tokens a
    draft already computed lets the next sequence's draft start after them; a block taken for
    new contents (eviction, reset) no longer counts."""
    a = make_seq(list(range(10)), "a")
    bm.allocate_prefix(a)
    compute(bm, a, 10)  # blocks [0..3] [4..7] [8, 9]
    assert bm.draft_cached_tokens(a) == 0  # no draft has run yet
    a.num_draft_computed_tokens = 6  # the draft caught up to token 6 only
    bm.mark_draft_ready(a)
    b = make_seq(list(range(8)) + [50, 51], "b")
    assert bm.allocate_prefix(b) == 8
    assert bm.draft_cached_tokens(b) == 4  # only the first block is in the draft's pool
    a.num_draft_computed_tokens = 11  # past the target's progress: only final tokens count
    bm.mark_draft_ready(a)
    assert bm.draft_cached_tokens(b) == 8
    c = make_seq(list(range(5)), "c")  # one cached block of a 5-token prompt: ready, 1 left
    assert bm.allocate_prefix(c) == 4 and bm.draft_cached_tokens(c) == 4
    ready = set(a.block_table[:2])
    for s in (a, b, c):
        bm.free(s)
    f = make_seq(list(range(200, 224)), "f")  # 6 blocks: every never-used or uncached one
    bm.allocate_prefix(f)
    compute(bm, f, 24)
    e = make_seq(list(range(100, 108)), "e")  # 2 blocks: a's cached ones, taken over
    bm.allocate_prefix(e)
    compute(bm, e, 8)
    assert set(e.block_table) == ready
    assert bm.draft_cached_tokens(e) == 0  # new contents: the draft's keys there are stale
    for s in (e, f):
        bm.free(s)
