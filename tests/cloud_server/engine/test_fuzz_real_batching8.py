"""Continuous batching fuzzed on the real SmolLM2 engine: a tiny KV pool, aborts, stops, drafts.

Seeded request mixes (plain and prompt-lookup requests, stop strings, EOS on or off, different
max_tokens) arrive a few at a time on a pool too small for them all, so requests are preempted and
recomputed; some are aborted before they start, while running and while preempted. After every
step the block accounting and prefix-cache tables are checked (``check_invariants`` of the fake
fuzz beside this file); at the end every block is free. Each request that was not aborted must
return exactly the tokens, text and finish reason of the same request in a plain, roomy batch
(greedy identity across batches is exact on CPU: test_batch_invariance.py; a seeded sampled
request draws from its own generator).
"""

from __future__ import annotations

import contextlib
import random

import pytest

from ._stepping import step_past_failures
from .test_fuzz_fake_batching8 import check_invariants

pytestmark = pytest.mark.real

QUESTIONS = [
    "Hi!",
    "List three colors.",
    "What is 7 times 8?",
    "Name a big city.",
    "Say hello in Spanish.",
    "Count from 1 to 10.",
    "Repeat: the cat sat on the mat, the cat sat on the mat.",
    "Why is the sky blue?",
]
NUM_BLOCKS = 8
STOPS = ["", "", "", ".", ",", " the", "\n", "3"]


@contextlib.contextmanager
def _tiny_pool(eng, num_blocks: int, max_num_seqs: int):
    from cloud_server.engine.block_manager import BlockManager
    from cloud_server.engine.scheduler import Scheduler

    saved = eng.block_manager, eng.scheduler
    eng.block_manager = BlockManager(num_blocks, saved[0].block_size)
    eng.scheduler = Scheduler(eng.block_manager, max_num_seqs=max_num_seqs, max_num_batched_tokens=64)
    try:
        yield eng
    finally:
        eng.block_manager, eng.scheduler = saved
        saved[0].reset_prefix_cache()  # the tiny pool rewrote the first blocks of the KV tensor


def _mix(eng, seed: int, n: int):
    from cloud_server.engine.sampling_params import SamplingParams

    rng = random.Random(seed)
    chat = eng.tokenizer.apply_chat_template
    out = []
    for i in range(n):
        prompt = eng.tokenizer.encode(chat([{"role": "user", "content": rng.choice(QUESTIONS)}]))
        stop = rng.choice(STOPS)
        # greedy, plain or with prompt lookup; or sampled with a seed, plain (a seed repeats its
        # tokens whatever the batch; with speculation it does not, see the README's engine section)
        kind = rng.choice(["none", "ngram", "ngram", "seeded"])
        params = SamplingParams(
            temperature=0.9 if kind == "seeded" else 0.0,
            seed=rng.randrange(1000) if kind == "seeded" else None,
            max_tokens=rng.randint(1, 24) if rng.random() < 0.4 else 24,
            ignore_eos=rng.random() < 0.7,
            stop=[stop] if stop else [],
            speculative_method="none" if kind == "seeded" else kind,
            num_speculative_tokens=rng.choice([2, 4]),
        )
        out.append((f"f{seed}-{i}", prompt, params))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fuzzed_mix_on_a_tiny_pool_matches_a_roomy_plain_batch(smollm2_engine, seed):
    from dataclasses import replace

    eng = smollm2_engine
    mix = _mix(eng, seed, 12)
    eng.block_manager.reset_prefix_cache()
    plain = [replace(p, speculative_method="none") for _, _, p in mix]
    reference = eng.generate([prompt for _, prompt, _ in mix], plain)
    rng = random.Random(seed)
    # aborted once it has this many output tokens (0: before its first step), or once preempted
    abort_at = {rid: rng.choice([0, 2, 5, "preempted"]) for rid, _, _ in mix if rng.random() < 0.3}
    abort_at[mix[-1][0]] = 0
    got = {rid: ([], "", None) for rid, _, _ in mix}
    aborted, states = set(), set()
    # 8 blocks of 16 slots: two or three requests (a prompt is 32-46 tokens with the template)
    with _tiny_pool(eng, NUM_BLOCKS, max_num_seqs=6):
        pending, steps = list(mix), 0
        while pending or eng.has_unfinished():
            for _ in range(6 if steps == 0 else rng.randint(0, 2)):  # a burst, then a trickle
                if pending:
                    eng.add_request(*pending.pop(0))
            for rid, at in list(abort_at.items()):
                req = eng._requests.get(rid)
                if req is None:
                    continue
                seq = req.seq
                if (seq.num_preemptions and seq.status.value == "waiting") if at == "preempted" \
                        else seq.num_output_tokens >= at:
                    states.add("preempted" if seq.num_preemptions else seq.status.value)
                    eng.abort(rid)
                    aborted.add(rid)
                    del abort_at[rid]
                    check_invariants(eng)
            for out in eng.step():
                ids, text, _ = got[out.request_id]
                got[out.request_id] = (ids + out.delta_token_ids, text + out.delta_text, out.finish_reason)
            check_invariants(eng)
            steps += 1
            assert steps < 400, "the mix did not finish"
        bm = eng.block_manager
        assert bm.num_free_blocks == bm.num_blocks and sum(bm.ref_counts) == 0
        assert eng.scheduler.num_preemptions > 0
    assert aborted and "waiting" in states
    for (rid, _, _), ref in zip(mix, reference, strict=True):
        if rid not in aborted:
            assert got[rid] == (ref.token_ids, ref.text, ref.finish_reason), rid


def test_generate_with_a_refused_prompt_leaves_nothing_behind(smollm2_engine):
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.exceptions import ContextLengthError

    eng = smollm2_engine
    too_long = [1] * eng.max_model_len
    with pytest.raises(ContextLengthError, match="context window"):
        eng.generate([[1, 2, 3], too_long], SamplingParams(max_tokens=4))
    assert not eng.has_unfinished() and not eng.scheduler.waiting and not eng.scheduler.running


def test_a_failed_step_with_model_drafts_is_rolled_back_and_the_request_finishes(smollm2_engine):
    """SmolLM2 drafting for itself; the target's step fails once while verifying drafts. The
    rollback must also take back the draft model's progress over the dropped drafts, or its next
    proposal starts past the sequence's end and every later step fails."""
    from cloud_server.engine.model_runner import ModelRunner
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.spec_decode.draft import DraftProposer

    eng = smollm2_engine
    prompt = eng.tokenizer.encode(eng.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Count from 1 to 10."}]))
    plain = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, speculative_method="none")
    (ref,) = eng.generate([prompt], plain)
    bm = eng.block_manager
    eng.spec.draft = DraftProposer(ModelRunner(eng.runner.model, eng.model_config, num_blocks=bm.num_blocks,
                                               block_size=bm.block_size, device=eng.device, dtype=eng.dtype))
    real, failed = eng.runner.execute, []

    def flaky(scheduled, **kw):
        if not failed and any(s.num_lookahead for s in scheduled):
            failed.append(True)
            raise RuntimeError("device lost")
        return real(scheduled, **kw)

    eng.runner.execute = flaky
    try:
        ids, errors = step_past_failures(
            eng, "rb", prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                              speculative_method="draft", num_speculative_tokens=3), 30)
    finally:
        eng.runner.execute = real
        eng.spec.draft = None
        bm.reset_prefix_cache()
    assert errors == ["model step failed: device lost"]
    assert ids == ref.token_ids
    assert bm.num_free_blocks == bm.num_blocks
