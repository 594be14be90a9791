"""The engine's prefix-cache counters agree with each request's ``cached_tokens``.

``prefix_cache_queries`` / ``prefix_cache_hits`` count each request's prompt once, at its first
admission: a request waiting for free blocks (looked up again every step) and one preempted and
recomputed (its own blocks found again) add nothing more. So, summed over requests,
queries == prompt tokens and hits == ``num_cached_tokens`` (``usage.prompt_tokens_details``).
"""

from __future__ import annotations

import pytest

from cloud_server.engine.block_manager import BlockManager
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.scheduler import Scheduler
from cloud_server.engine.sequence import Sequence

BS = 4


def _seq(rid: str, tokens: list[int], max_tokens: int = 100) -> Sequence:
    return Sequence(rid, tokens, SamplingParams(max_tokens=max_tokens))


def _step(sched: Scheduler):
    out = sched.schedule()
    sched.update(out.scheduled, {i.seq.seq_id: [7] for i in out.scheduled if i.samples})
    return out


def test_waiting_and_preempted_requests_are_counted_once():
    bm = BlockManager(4, BS)  # 16 token slots
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    a = _seq("a", list(range(7)))  # 2 blocks
    b = _seq("b", list(range(4)) + [50, 51, 52])  # shares a's first block: a 4-token hit
    sched.add(a)
    _step(sched)  # a: prefill, registers its first full block
    sched.add(b)
    _step(sched)  # b admitted with a hit; a decodes; pool full
    assert b.num_cached_tokens == 4
    c = _seq("c", list(range(4)) + [60, 61])  # would hit a's first block too, but must wait
    sched.add(c)
    waited = preempted = 0
    for _ in range(6):  # a and b decode; the pool has no block for c, so c waits every step
        out = _step(sched)
        waited += c in sched.waiting and not out.preempted
        preempted += len(out.preempted)
    assert waited >= 3, "c must wait for free blocks over several steps"
    assert preempted >= 1 and b.num_preemptions >= 1, "b must be preempted and recomputed"
    for seq in (a, b):
        sched.finish(seq, "stop")
    for _ in range(3):
        _step(sched)
    assert c in sched.running
    sched.finish(c, "stop")
    assert bm.num_free_blocks == bm.num_blocks

    seqs = (a, b, c)
    assert bm.prefix_cache_queries == sum(s.num_prompt_tokens for s in seqs)
    assert bm.prefix_cache_hits == sum(s.num_cached_tokens for s in seqs)
    assert bm.prefix_cache_hits == 4 + c.num_cached_tokens


def test_a_request_that_never_got_blocks_is_not_counted():
    # 3 blocks: a (10 tokens by the end) holds the pool; in 2 it grew past it and was ended
    bm = BlockManager(3, BS)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    a = _seq("a", list(range(7)))
    sched.add(a)
    _step(sched)
    late = _seq("late", list(range(100, 107)))
    sched.add(late)
    for _ in range(3):
        _step(sched)
    assert late in sched.waiting
    sched.finish(late, "abort")
    assert bm.prefix_cache_queries == a.num_prompt_tokens
    sched.finish(a, "stop")


def test_a_direct_lookup_still_counts():
    """Called on its own (no scheduler), a lookup is one request's: counted as before."""
    bm = BlockManager(8, BS)
    seq = _seq("x", list(range(9)))
    bm.allocate_prefix(seq)
    assert bm.prefix_cache_queries == 9 and bm.prefix_cache_hits == 0
    bm.free(seq)


@pytest.mark.real
def test_engine_stats_match_usage_under_memory_pressure(smollm2_engine):
    """Real SmolLM2 weights: a pool too small for the batch, so requests wait and get preempted;
    the engine's counters still equal the sum of the outputs' prompt and cached tokens."""
    eng = smollm2_engine
    chat = eng.tokenizer.apply_chat_template
    system = {"role": "system", "content": "You are a terse assistant. Answer in one short sentence."}
    prompts = [chat([system, {"role": "user", "content": q}]) for q in (
        "What is the capital of Japan?", "Why is the sky blue?", "Name a prime number.",
        "What is the capital of Japan?", "How many legs does a spider have?", "List two fruits.",
    )]
    bs = eng.block_manager.block_size
    lens = [len(eng.tokenizer.encode(p)) for p in prompts]
    # room for about three prompts at once: the rest wait, and decoding past a block boundary
    # preempts the newest running one
    num_blocks = sum(-(-n // bs) for n in lens[:3]) + 1
    saved = eng.block_manager, eng.scheduler
    eng.block_manager = BlockManager(num_blocks, bs)
    eng.scheduler = Scheduler(eng.block_manager, max_num_seqs=6, max_num_batched_tokens=2048)
    waiting_steps = 0
    schedule = eng.scheduler.schedule

    def recording_schedule(*args, **kwargs):
        nonlocal waiting_steps
        out = schedule(*args, **kwargs)
        waiting_steps += bool(eng.scheduler.waiting and eng.scheduler.running)
        return out

    eng.scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    try:
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        outs = eng.generate(prompts, params)
        stats = eng.stats()
        assert eng.block_manager.num_free_blocks == num_blocks
    finally:
        eng.block_manager, eng.scheduler = saved
        # the borrowed pool wrote its keys and values over the shared engine's first blocks:
        # the engine's own prefix cache must forget what it thought they held
        eng.block_manager.reset_prefix_cache()
    assert waiting_steps >= 3 and stats["num_preemptions"] >= 1
    assert [o.num_prompt_tokens for o in outs] == lens
    assert stats["prefix_cache_queries"] == sum(lens)
    assert stats["prefix_cache_hits"] == sum(o.num_cached_tokens for o in outs)
    assert stats["prefix_cache_hits"] > 0  # the system prompt's blocks are shared
