"""A sequence that grows past the whole KV pool (review 19), on plain data.

Used directly, the Scheduler takes a prompt that fits the pool, but nothing stopped the sequence's
outputs from growing past it: it preempted itself and waited at the head of the queue for blocks
that never come, so every later ``schedule()`` was empty, for it and for every request behind it.
It is ended now with finish_reason "length" (reported in ``SchedulerOutput.finished``), its
blocks go back, and the requests behind it run.
"""

from __future__ import annotations

from cloud_server.engine.block_manager import BlockManager
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.scheduler import Scheduler
from cloud_server.engine.sequence import Sequence, SequenceStatus

BS = 4


def _step(sched: Scheduler):
    out = sched.schedule()
    sched.update(out.scheduled, {i.seq.seq_id: [7] for i in out.scheduled if i.samples})
    return out


def test_a_sequence_grown_past_the_pool_is_finished_not_stalled():
    bm = BlockManager(2, BS)  # 8 token slots
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=32, max_waiting=8)
    a = Sequence("a", list(range(6)), SamplingParams(max_tokens=100))
    b = Sequence("b", [50, 51], SamplingParams(max_tokens=100))
    sched.add(a)
    finished = []
    for _ in range(10):
        out = _step(sched)
        finished += getattr(out, "finished", [])  # (not on the old code: it stalled)
        if a.is_finished:
            break
    assert finished == [a] and a.finish_reason == "length"
    assert a.num_tokens == 2 * BS + 1  # its last token needed a third block
    assert a.status is SequenceStatus.FINISHED and not a.block_table
    assert bm.num_free_blocks == bm.num_blocks  # nothing leaked
    sched.add(b)  # and the queue moves on
    assert [i.seq for i in _step(sched).scheduled] == [b]
    sched.finish(b, "abort")
    assert bm.num_free_blocks == bm.num_blocks


def test_the_requests_waiting_behind_it_run():
    bm = BlockManager(3, BS)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=32, max_waiting=8, watermark=0)
    a = Sequence("a", list(range(BS * 2)), SamplingParams(max_tokens=100))
    sched.add(a)
    _step(sched)  # a: 8 computed, a 9th token sampled
    b = Sequence("b", [50], SamplingParams(max_tokens=100))
    sched.add(b)  # waits: a takes the pool's last block
    for _ in range(8):
        out = _step(sched)
        if b.status is SequenceStatus.RUNNING:
            break
    # a grew to 13 tokens (4 blocks of a 3-block pool): ended, and b starts in the same step
    assert a.finish_reason == "length" and a in getattr(out, "finished", [])
    assert [i.seq for i in out.scheduled] == [b] and b.num_preemptions == 0
    sched.finish(b, "abort")
    assert bm.num_free_blocks == bm.num_blocks
