"""A failed admission leaves the prefix cache as it was (review 17), on plain data.

The scheduler looked a waiting request's prefix up (``allocate_prefix``) and, when the rest did
not fit the free blocks, freed the hit blocks at once. That lookup marked them "reused" and put
them at the newest end of the LRU: a request that waited and was then aborted promoted one-off
blocks to the class a shared system prompt lives in, where they outlived that prompt. The fit is
now counted first (``blocks_to_admit``), taking nothing.
"""

from __future__ import annotations

from cloud_server.engine.block_manager import BlockManager
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.scheduler import Scheduler
from cloud_server.engine.sequence import Sequence

BS = 4
SYSTEM = list(range(500, 508))  # a shared system prompt: 2 blocks
ONE_OFF = list(range(600, 608))  # a one-off question's 2 blocks
OTHER = list(range(700, 708))  # another one-off, freed after it


def make_seq(tokens: list[int], rid: str) -> Sequence:
    return Sequence(rid, tokens, SamplingParams(max_tokens=100))


def compute(bm: BlockManager, seq: Sequence, n: int) -> None:
    bm.append_slots(seq, n)
    seq.num_computed_tokens += n
    bm.commit(seq)


def cache(bm: BlockManager) -> None:
    """SYSTEM served a hit (class "reused"); ONE_OFF then OTHER did not (class "once")."""
    a, b = make_seq(SYSTEM + [1], "a"), make_seq(SYSTEM + [2], "b")
    bm.allocate_prefix(a)
    compute(bm, a, 9)
    assert bm.allocate_prefix(b) == 8
    compute(bm, b, 1)
    bm.free(a)
    bm.free(b)
    for k, prompt in enumerate((ONE_OFF, OTHER)):
        seq = make_seq(prompt + [3], f"once{k}")
        bm.allocate_prefix(seq)
        compute(bm, seq, 9)
        bm.free(seq)


def lru(bm: BlockManager) -> tuple[list[int], list[int], list[bool]]:
    return list(bm._evictable), list(bm._evictable_reused), list(bm._reused)


def test_the_admission_check_takes_nothing_and_counts_the_hits_it_would_take():
    bm = BlockManager(16, BS)
    cache(bm)
    before = lru(bm)
    free = bm.num_free_blocks
    # hits in the middle of both lists: the older one-off's blocks, and the system prompt's
    for prompt in (ONE_OFF, SYSTEM):
        seq = make_seq(prompt + list(range(900, 920)), "waits")  # 7 blocks, 2 of them cached
        assert bm.blocks_to_admit(seq) == (5, free - 2)
        assert lru(bm) == before and not seq.block_table, prompt
    assert bm.num_free_blocks == bm.num_blocks


def test_an_aborted_waiting_request_does_not_make_its_prefix_outlive_a_shared_prompt():
    bm = BlockManager(16, BS)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    cache(bm)
    hog = make_seq(list(range(1000, 1032)), "hog")  # 8 blocks, running
    sched.add(hog)
    out = sched.schedule()
    sched.update(out.scheduled, {i.seq.seq_id: [7] for i in out.scheduled if i.samples})
    waits = make_seq(ONE_OFF + list(range(900, 924)), "waits")  # ONE_OFF's blocks + 6 more
    sched.add(waits)
    for _ in range(3):  # it waits a few steps for blocks, then its client gives up
        out = sched.schedule()
        assert [i.seq for i in out.scheduled] == [hog]
        sched.update(out.scheduled, {hog.seq_id: [7]})
        assert waits in sched.waiting and not waits.block_table
    sched.finish(waits, "abort")
    # the pool runs short: the fresh blocks, then the one-off blocks go, not the system prompt
    fill = make_seq(list(range(2000, 2000 + BS * (len(bm._fresh) + 4))), "fill")
    bm.allocate_prefix(fill)
    compute(bm, fill, fill.num_tokens)
    probe = make_seq(SYSTEM + [9], "probe")
    assert bm.allocate_prefix(probe) == 8
    gone = make_seq(ONE_OFF + [9], "gone")
    assert bm.allocate_prefix(gone) == 0
    for seq in (probe, gone, fill):
        bm.free(seq)
    sched.finish(hog, "stop")
    assert bm.num_free_blocks == bm.num_blocks
    assert all(r == 0 for r in bm.ref_counts)


def test_an_admitted_request_still_takes_its_hits_and_marks_them_reused():
    bm = BlockManager(16, BS)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    cache(bm)
    seq = make_seq(ONE_OFF + [5, 6], "admitted")
    sched.add(seq)
    out = sched.schedule()
    assert [(i.seq, i.num_new_tokens) for i in out.scheduled] == [(seq, 2)]
    assert seq.num_cached_tokens == 8
    hits = seq.block_table[:2]
    assert all(bm._reused[b] for b in hits)
    sched.finish(seq, "stop")
    assert all(b in bm._evictable_reused for b in hits)  # the class of a prompt that served a hit
    assert bm.num_free_blocks == bm.num_blocks
