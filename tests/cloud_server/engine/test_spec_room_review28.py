"""Draft slots at a block boundary on a full pool (plain data, no model).

``Scheduler.schedule`` gives a decoding sequence draft slots only in room that no other sequence's
plain step needs. A sequence whose next token starts a new block takes that block for its plain
step anyway, and the block's other slots can hold drafts; the room left them out, so on a pool
with no block to spare such a sequence drafted nothing until its plain token had filled a slot of
the new block. Drafts still never take a block that another sequence's plain step needs, and the
table always covers every position the step writes.
"""

from __future__ import annotations

from cloud_server.engine.block_manager import BlockManager
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.scheduler import Scheduler
from cloud_server.engine.sequence import Sequence

BS = 4


def _decoding(sched: Scheduler, *prompt_lens: int) -> list[Sequence]:
    """Sequences whose prompts one step computed and whose first output token waits."""
    seqs = [Sequence(f"r{i}", list(range(100 * i, 100 * i + n)), SamplingParams(max_tokens=50))
            for i, n in enumerate(prompt_lens)]
    for seq in seqs:
        sched.add(seq)
    out = sched.schedule()
    assert [i.seq for i in out.scheduled] == seqs
    sched.update(out.scheduled, {seq.seq_id: [7] for seq in seqs})
    assert all(seq.num_uncomputed_tokens == 1 for seq in seqs)
    return seqs


def _scheduler(num_blocks: int) -> tuple[BlockManager, Scheduler]:
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=False)
    return bm, Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, watermark=0)


def test_drafts_fill_the_block_the_plain_step_takes_anyway():
    bm, sched = _scheduler(3)
    (seq,) = _decoding(sched, 2 * BS)  # 9 tokens: the 9th starts block 3, the pool's last
    assert bm.num_free_blocks == 1
    out = sched.schedule(lambda s, n: 5)
    (item,) = out.scheduled
    assert item.num_spec_slots == BS - 1  # positions 8..11, all in the third block
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 0
    assert bm.num_blocks_for(seq.num_computed_tokens + 1 + item.num_spec_slots) <= len(seq.block_table)


def test_drafts_never_take_the_block_another_plain_step_needs():
    bm, sched = _scheduler(4)
    # a's next token starts a third block, b's a second one
    a, b = _decoding(sched, 2 * BS, BS)
    assert bm.num_free_blocks == 1  # a took 2, b 1: one block for two plain steps
    out = sched.schedule(lambda s, n: 5)
    # one of them is preempted for the other's plain step; no draft took the last block
    assert [i.seq for i in out.scheduled] == [a] and out.preempted == [b]
    assert out.scheduled[0].num_spec_slots == 0


def test_drafts_when_every_plain_step_fits_and_one_block_is_spare():
    bm, sched = _scheduler(5)
    a, b = _decoding(sched, 2 * BS, BS)  # next tokens start a third block and a second one
    assert bm.num_free_blocks == 2  # both plain steps fit, with none to spare
    out = sched.schedule(lambda s, n: 5)
    assert [(i.seq, i.num_spec_slots) for i in out.scheduled] == [(a, BS - 1), (b, BS - 1)]
    assert bm.num_free_blocks == 0
    for seq in (a, b):
        assert bm.num_blocks_for(seq.num_tokens + BS - 1) <= len(seq.block_table)
