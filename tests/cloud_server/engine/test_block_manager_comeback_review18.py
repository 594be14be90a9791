"""A preempted sequence's comeback is no prefix hit by another request (review 18), plain data.

A preempted sequence is recomputed through the prefix cache: it takes back the blocks its own
earlier steps computed. ``allocate_prefix`` marked every block it served "reused", the eviction
class meant for blocks shared by different requests (system prompts), so a one-off answer that
was once preempted outlived a shared prompt's blocks. Only a hit on a block another sequence
computed marks it reused now.
"""

from __future__ import annotations

from cloud_server.engine.block_manager import BlockManager
from cloud_server.engine.scheduler import Scheduler

from .test_block_manager_admission_review17 import compute, make_seq

BS = 4



def test_own_blocks_taken_back_after_preemption_stay_in_the_once_class():
    bm = BlockManager(8, BS)
    a = make_seq(list(range(100, 109)), "a")
    bm.allocate_prefix(a)
    compute(bm, a, 9)
    own = list(a.block_table[:2])
    bm.free(a)  # a preemption frees them ...
    a.reset_for_recompute()
    assert bm.allocate_prefix(a) == 8  # ... and the comeback takes them back
    assert a.block_table[:2] == own
    assert not any(bm._reused[b] for b in own)
    bm.free(a)
    assert all(b in bm._evictable for b in own) and not bm._evictable_reused


def test_a_hit_by_another_request_still_marks_reused_after_a_comeback():
    bm = BlockManager(8, BS)
    a, b = make_seq(list(range(100, 109)), "a"), make_seq(list(range(100, 108)) + [5], "b")
    bm.allocate_prefix(a)
    compute(bm, a, 9)
    bm.free(a)
    a.reset_for_recompute()
    bm.allocate_prefix(a)  # own comeback: not reused
    assert bm.allocate_prefix(b) == 8  # another request: reused
    assert all(bm._reused[blk] for blk in b.block_table[:2])


def test_a_preempted_one_off_request_does_not_outlive_a_shared_system_prompt():
    """Through the scheduler: SYSTEM served a hit; ONE_OFF was preempted once and came back.
    Fresh blocks then needed evict ONE_OFF's blocks, never the system prompt's."""
    bm = BlockManager(8, BS)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, watermark=0.0)
    system = list(range(500, 508))
    s1, s2 = make_seq(system + [1], "s1"), make_seq(system + [2], "s2")
    for s in (s1, s2):
        sched.add(s)
        out = sched.schedule()
        sched.update(out.scheduled, {s.seq_id: [9]})
        sched.finish(s, "stop")
    sys_blocks = [b for b in range(8) if bm._reused[b]]
    assert len(sys_blocks) == 2
    one_off = make_seq(list(range(600, 608)) + [3], "one")
    sched.add(one_off)
    out = sched.schedule()
    sched.update(out.scheduled, {one_off.seq_id: [9]})
    sched._preempt(one_off, out)  # as the scheduler does when the pool runs out
    out = sched.schedule()  # the comeback, from its own cached blocks
    assert one_off.block_table and out.scheduled[0].seq is one_off
    sched.update(out.scheduled, {one_off.seq_id: [9]})
    one_off_blocks = list(one_off.block_table[:2])
    sched.finish(one_off, "stop")
    # a new request needing every block but two: the two left cached are the system prompt's
    big = make_seq(list(range(800, 824)), "big")
    sched.add(big)
    sched.schedule()
    assert sorted(big.block_table) == sorted(set(range(8)) - set(sys_blocks))
    assert all(b in big.block_table for b in one_off_blocks)
    assert bm._hash_to_block.get(bm._block_hash[sys_blocks[0]]) == sys_blocks[0]
