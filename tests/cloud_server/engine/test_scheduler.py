"""Scheduler on plain data: batching, chunked prefill, prefix hits, preemption, abort, no leaks."""

from __future__ import annotations

import pytest

from cloud_server.engine.block_manager import BlockManager
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.scheduler import Scheduler
from cloud_server.engine.sequence import Sequence, SequenceStatus
from cloud_server.exceptions import QueueFullError

BS = 4


def make_seq(n: int, rid: str, start: int = 0) -> Sequence:
    return Sequence(rid, list(range(start, start + n)), SamplingParams(max_tokens=100))


def run_step(sched: Scheduler, next_token: int = 7):
    """Schedule, pretend to compute, append a token to every sequence that reached its end."""
    out = sched.schedule()
    sched.update(out.scheduled, {i.seq.seq_id: [next_token] for i in out.scheduled if i.samples})
    return out


def finish_all(sched: Scheduler) -> None:
    for seq in list(sched.running) + list(sched.waiting):
        sched.finish(seq, "abort")


@pytest.fixture
def make_sched():
    made = []

    def factory(num_blocks=16, max_num_seqs=4, max_tokens=32, max_waiting=8):
        bm = BlockManager(num_blocks, BS)
        s = Scheduler(bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_tokens,
                      max_waiting=max_waiting)
        made.append(s)
        return s

    yield factory
    for s in made:
        finish_all(s)
        assert s.block_manager.num_free_blocks == s.block_manager.num_blocks  # no leaks
        assert all(r == 0 for r in s.block_manager.ref_counts)


def test_decode_and_prefill_share_a_step(make_sched):
    sched = make_sched()
    a = make_seq(5, "a")
    sched.add(a)
    out = run_step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 5)]
    b = make_seq(6, "b", 100)
    sched.add(b)  # joins at the next step, next to a's decode token
    out = run_step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 6)]
    assert a.num_output_tokens == 2 and b.num_output_tokens == 1


def test_chunked_prefill_respects_token_budget(make_sched):
    sched = make_sched(num_blocks=32, max_tokens=8)
    a = make_seq(20, "a")
    sched.add(a)
    chunks = [run_step(sched).scheduled[0].num_new_tokens for _ in range(3)]
    assert chunks == [8, 8, 4]
    assert a.num_output_tokens == 1  # sampled only when the prompt was complete
    assert len(a.block_table) == 5


def test_max_num_seqs_limits_running(make_sched):
    sched = make_sched(max_num_seqs=2)
    for i in range(3):
        sched.add(make_seq(3, f"s{i}", 10 * i))
    out = run_step(sched)
    assert len(out.scheduled) == 2 and len(sched.waiting) == 1


def test_finished_sequence_leaves_at_once(make_sched):
    sched = make_sched(max_num_seqs=1)
    a, b = make_seq(3, "a"), make_seq(3, "b", 50)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    sched.finish(a, "stop")
    assert a.status is SequenceStatus.FINISHED and not a.block_table
    out = run_step(sched)
    assert [s.seq.request_id for s in out.scheduled] == ["b"]


def test_prefix_hit_skips_cached_blocks(make_sched):
    sched = make_sched()
    a = make_seq(9, "a")
    sched.add(a)
    run_step(sched)
    b = Sequence("b", list(range(8)) + [60, 61], SamplingParams())
    sched.add(b)
    out = run_step(sched)
    item = [s for s in out.scheduled if s.seq is b][0]
    assert b.num_cached_tokens == 8 and item.num_new_tokens == 2


def test_preempts_newest_and_recomputes_it(make_sched):
    sched = make_sched(num_blocks=4, max_tokens=64)
    sched.watermark_blocks = 0  # the preemption mechanism itself: let b fill the pool
    a, b = make_seq(7, "a"), make_seq(7, "b", 100)
    sched.add(a)
    sched.add(b)
    run_step(sched)  # a: 2 blocks, b: 2 blocks, pool full
    assert sched.block_manager.num_free_blocks == 0
    run_step(sched)  # both decode into their second block (8 tokens)
    out = run_step(sched)  # a needs a third block: b (newest) is preempted
    assert out.preempted == [b] and sched.num_preemptions == 1
    assert b.status is SequenceStatus.WAITING and not b.block_table and sched.waiting[0] is b
    assert [s.seq for s in out.scheduled] == [a]
    sched.finish(a, "stop")
    out = run_step(sched)  # b comes back and recomputes prompt + outputs (prefix cache helps)
    assert out.scheduled[0].seq is b
    assert b.num_computed_tokens == b.num_tokens - 1 and b.num_output_tokens == 3


def test_abort_waiting_and_running_frees_blocks(make_sched):
    sched = make_sched(max_num_seqs=1)
    a, b = make_seq(6, "a"), make_seq(6, "b", 50)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    used = sched.block_manager.num_used_blocks
    sched.finish(a, "abort")
    assert sched.block_manager.num_used_blocks == used - 2
    sched.finish(b, "abort")
    assert sched.num_unfinished == 0


def test_queue_full(make_sched):
    # max_num_seqs=4: a burst that fits the free batch slots is not a queue; 2 may wait beyond it
    sched = make_sched(max_waiting=2)
    for name in "abcdef":
        sched.add(make_seq(2, name))
    with pytest.raises(QueueFullError):
        sched.add(make_seq(2, "g"))


def test_core_bookkeeping_needs_no_torch():
    import subprocess
    import sys

    code = (
        "import sys, cloud_server.engine.scheduler, cloud_server.engine.async_engine; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_update_applies_a_multi_token_step_and_trims_rejected_tokens(make_sched):
    sched = make_sched(num_blocks=16)
    bm = sched.block_manager
    seq = make_seq(6, "spec")
    sched.add(seq)
    run_step(sched, next_token=100)  # prefill 6 -> samples token 100
    assert seq.num_tokens == 7 and seq.num_computed_tokens == 6
    drafts = [101, 102, 103, 104, 105]
    seq.token_ids.extend(drafts)  # a proposer's guesses: 12 tokens, 6 computed
    out = sched.schedule()
    [item] = out.scheduled
    item.num_lookahead = len(drafts)
    assert item.num_new_tokens == 6 and item.num_outputs == 6
    assert len(seq.block_table) == 3  # room for all 12
    # verification accepted 101 and 102, rejected 103..105, and sampled 200 after 102
    appended = sched.update(out.scheduled, {seq.seq_id: [200]}, {seq.seq_id: 3})
    assert appended == [(seq, [101, 102, 200])]  # accepted drafts too: the stop checks see them
    assert seq.token_ids[6:] == [100, 101, 102, 200]
    assert seq.num_computed_tokens == 9  # up to 102; 200 is computed by the next step
    assert len(seq.block_table) == 3 and len(seq.block_hashes) == 2
    assert bm.num_used_blocks == 3
    # a rejection that empties the last block gives it back
    seq.token_ids.extend([300, 301, 302])
    out = sched.schedule()
    out.scheduled[0].num_lookahead = 3
    sched.update(out.scheduled, {seq.seq_id: [400]}, {seq.seq_id: 3})
    assert seq.num_computed_tokens == 10 and seq.token_ids[-2:] == [200, 400]
    assert len(seq.block_table) == 3 and bm.num_used_blocks == 3
    seq.token_ids.extend([500, 501, 502, 503, 504, 505])
    out = sched.schedule()
    assert len(seq.block_table) == 5  # 17 tokens
    sched.update(out.scheduled, {seq.seq_id: [600]}, {seq.seq_id: 6})
    assert seq.num_computed_tokens == 11 and len(seq.block_table) == 3
    assert bm.num_used_blocks == 3
    finish_all(sched)
    assert bm.num_free_blocks == bm.num_blocks


def test_trim_never_caches_a_block_with_rejected_tokens(make_sched):
    sched = make_sched(num_blocks=16)
    bm = sched.block_manager
    seq = make_seq(3, "a")
    sched.add(seq)
    run_step(sched, next_token=50)  # 4 tokens, 3 computed
    seq.token_ids.extend([60, 61, 62, 63])  # block 1 would be [61, 62, 63, x]
    out = sched.schedule()
    sched.update(out.scheduled, {seq.seq_id: [70]}, {seq.seq_id: 4})  # reject all four
    assert seq.token_ids == [0, 1, 2, 50, 70] and seq.num_computed_tokens == 4
    assert bm.num_cached_blocks == 1  # block 0 = [0, 1, 2, 50], full and accepted
    other = Sequence("b", [0, 1, 2, 50, 60, 61, 62, 63, 9], SamplingParams(max_tokens=4))
    sched.add(other)
    sched.schedule()
    assert other.num_cached_tokens == 4  # only the accepted block is found
    finish_all(sched)
    assert bm.num_free_blocks == bm.num_blocks


def test_cached_tokens_count_only_the_first_schedule(make_sched):
    """A request preempted in the middle of its prefill finds its own first chunks in the prefix
    cache when it comes back: that is not a prefix hit to report (usage's cached tokens).

    b's whole prompt fits when it is admitted (3 blocks + the 1-block watermark of 4 free); what
    preempts it is the running ones' growth beyond the watermark: a and c both cross into a new
    block in the same step, and b's last chunk finds the pool full."""
    sched = make_sched(num_blocks=6, max_tokens=8)
    a, c, b = make_seq(3, "a"), make_seq(3, "c", 50), make_seq(12, "b", 100)
    for seq in (a, c, b):
        sched.add(seq)
    run_step(sched)  # a's and c's prompts, b's first 2 prompt tokens
    run_step(sched)  # a and c decode (a new block each), b's next 6 (blocks 0 and 1 full, cached)
    assert b.num_computed_tokens == 8 and b.num_cached_tokens == 0
    out = run_step(sched)  # b's last chunk needs a block: none is free, b (the newest) goes
    assert out.preempted == [b]
    sched.finish(a, "stop")
    sched.finish(c, "stop")
    out = run_step(sched)
    assert out.scheduled[0].seq is b and b.num_computed_tokens > 4  # its blocks came back
    assert b.num_cached_tokens == 0
