"""A chunked prefill is admitted on its whole prompt, not on its first chunk.

Before, the scheduler checked only the first chunk of a prompt longer than the step's token budget
against the free blocks: on a tight pool the prompt started, its later chunks found the pool full,
and it was preempted (or preempted those admitted after it), recomputing what it had computed.
"""

from __future__ import annotations

import pytest

from cloud_server.engine.block_manager import BlockManager
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.scheduler import Scheduler
from cloud_server.engine.sequence import Sequence, SequenceStatus

from .pools import small_pool
from .test_fuzz_fake_batching8 import check_invariants, make_engine
from .test_watermark_engine9 import _count_recomputed

BS = 4


def _seq(n: int, rid: str, start: int = 0) -> Sequence:
    return Sequence(rid, list(range(start, start + n)), SamplingParams(max_tokens=100))


def _step(sched: Scheduler):
    out = sched.schedule()
    sched.update(out.scheduled, {i.seq.seq_id: [7] for i in out.scheduled if i.samples})
    return out


def test_a_long_prompt_waits_for_room_instead_of_preempting_itself_mid_prefill():
    # 6 blocks of 4, 8 tokens a step. a (8 tokens) runs; b's 16-token prompt needs 4 blocks, and
    # after a's 3 only 3 are free: its first chunk (7 tokens, 2 blocks + the 1-block watermark)
    # would fit, and the first-chunk check let it in, to be preempted by its own second chunk.
    sched = Scheduler(BlockManager(6, BS), max_num_seqs=4, max_num_batched_tokens=8)
    a, b = _seq(8, "a"), _seq(16, "b", 100)
    sched.add(a)
    sched.add(b)
    _step(sched)  # a's prompt, alone
    for _ in range(3):  # a decodes; b waits, holding no block
        out = _step(sched)
        assert [i.seq for i in out.scheduled] == [a] and not out.preempted
        assert b.status is SequenceStatus.WAITING and not b.block_table
    sched.finish(a, "stop")
    for _ in range(2):  # alone it starts and its two chunks run through
        out = _step(sched)
        assert [i.seq for i in out.scheduled] == [b] and not out.preempted
    assert b.num_computed_tokens == 16 and sched.num_preemptions == 0
    sched.finish(b, "stop")
    assert sched.block_manager.num_free_blocks == 6


def test_a_chunked_prompt_that_needs_the_whole_pool_starts_when_alone():
    """No margin alone: a prompt as big as the pool, three chunks of 8 tokens, starts at once."""
    eng = make_engine(6, budget=8)
    prompt = [(3 * j) % 26 for j in range(22)]
    eng.add_request("big", prompt, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    for _ in range(5):
        if not eng.has_unfinished():
            break
        eng.step()
        check_invariants(eng)
    assert not eng.has_unfinished() and eng.scheduler.num_preemptions == 0
    assert eng.block_manager.num_free_blocks == 6


def _fake_run(num_blocks: int) -> tuple[int, int, list[list[int]]]:
    """Two short requests that decode long and two prompts three chunks long, 8 tokens a step."""
    eng = make_engine(num_blocks, max_num_seqs=4, budget=8)
    counts = _count_recomputed(eng)
    prompts = [[(5 * i + j) % 26 for j in range(n)] for i, n in enumerate([5, 22, 6, 21])]
    max_tokens = [14, 3, 14, 3]
    ids: dict[str, list[int]] = {}
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        eng.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        ids[f"r{i}"] = []
    for _ in range(200):
        if not eng.has_unfinished():
            break
        for out in eng.step():
            ids[out.request_id] += out.delta_token_ids
        check_invariants(eng)
    assert not eng.has_unfinished(), f"stuck: {eng.scheduler.waiting}"
    return eng.scheduler.num_preemptions, counts["recomputed"], list(ids.values())


def test_a_tight_pool_runs_long_prompts_without_recomputing_them():
    roomy = _fake_run(64)
    tight = _fake_run(9)
    assert tight[2] == roomy[2]  # the same answers: only the schedule differs
    assert tight[:2] == (0, 0), f"preemptions, recomputed tokens: {tight[:2]}"


@pytest.mark.real
def test_real_model_long_prompt_beside_running_ones_is_not_preempted(smollm2_engine):
    """SmolLM2: two chat prompts (32, 35 tokens) decoding 40 tokens each and a 127-token prompt
    (four chunks of 32), 10 blocks of 16 slots. Measured (2026-11-28): first-chunk admission 1
    preemption and 94 tokens recomputed (50 steps); whole-prompt admission none (52 steps), the
    same answers."""
    eng = smollm2_engine
    tok = eng.tokenizer
    short = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]))
             for q in ["Hi!", "Name a big city."]]
    story = "Write a long story about a lighthouse keeper who finds a message in a bottle. " * 6
    long = tok.encode(tok.apply_chat_template([{"role": "user", "content": story}]))
    assert len(long) > 3 * 32  # chunked: longer than three steps' budget
    params = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)] * 2 + [
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)]
    roomy = [r.token_ids for r in eng.generate(short + [long], params)]
    real_execute = eng.runner.execute
    try:  # the default watermark (1%: one block)
        with small_pool(eng, 10, max_num_seqs=4, max_num_batched_tokens=32, watermark=0.01):
            counts = _count_recomputed(eng)
            tight = [r.token_ids for r in eng.generate(short + [long], params)]
            assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
            assert (eng.scheduler.num_preemptions, counts["recomputed"]) == (0, 0)
    finally:
        eng.runner.execute = real_execute
    assert tight == roomy
