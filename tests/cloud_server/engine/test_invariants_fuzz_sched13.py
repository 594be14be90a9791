"""Random add / abort / step sequences on the real engine code around the KV-honest fake model,
with the block accounting checked after every operation.

Beyond test_fuzz_fake_batching8 (which compares outputs with each request run alone), this one
varies the pool, the batch, the token budget (down to one token: every prompt is chunked) and the
watermark, aborts at any point (waiting, mid-chunk, running, preempted, finished, unknown, twice),
and checks the counters: prefix-cache queries and hits equal the sum over admitted requests of
their prompt and cached tokens, and the preemption count equals the requests' own counts.
"""

from __future__ import annotations

import random

import pytest

from cloud_server.engine.sampling_params import SamplingParams

from .test_fuzz_fake_batching8 import VOCAB, check_invariants, make_engine

_HEADS = [[1, 2, 3, 4, 5, 6, 7, 8], [9] * 8, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]]


def _check_pool(eng) -> None:
    check_invariants(eng)
    bm = eng.block_manager
    free = {*bm._fresh, *bm._evictable, *bm._evictable_reused}
    held = {b for s in eng.scheduler.running for b in s.block_table}
    assert not free & held, "a block is both free and held"
    assert len(free) + len(held) == bm.num_blocks == bm.num_free_blocks + bm.num_used_blocks


def _check_counters(eng, seqs, admitted: set[int]) -> None:
    admitted |= {s.seq_id for s in eng.scheduler.running}
    done = [s for s in seqs if s.seq_id in admitted or s.num_preemptions
            or s.finish_reason not in (None, "abort")]
    bm = eng.block_manager
    assert bm.prefix_cache_queries == sum(s.num_prompt_tokens for s in done)
    assert bm.prefix_cache_hits == sum(s.num_cached_tokens for s in done)
    assert all(s.num_cached_tokens < s.num_prompt_tokens for s in seqs)
    assert eng.scheduler.num_preemptions == sum(s.num_preemptions for s in seqs)


def _run(seed: int) -> int:
    rng = random.Random(seed)
    draft = rng.random() < 0.3
    eng = make_engine(rng.randint(4, 14), max_num_seqs=rng.randint(1, 6),
                      budget=rng.choice([1, 2, 3, 5, 8, 24]), draft=draft,
                      prefix_caching=rng.random() < 0.8)
    eng.scheduler.watermark_blocks = rng.choice([0, 0, 1, 2])
    methods = ["none", "ngram"] + (["draft"] if draft else [])
    seqs, rids, admitted = [], [], set()
    for _ in range(300):
        r = rng.random()
        if r < 0.25 and len(rids) < 30:
            n = rng.randint(1, eng.max_model_len - 1)
            prompt = (rng.choice(_HEADS) + [rng.randrange(VOCAB) for _ in range(n)])[:n]
            params = SamplingParams(temperature=0.0, max_tokens=rng.randint(1, eng.max_model_len - n),
                                    ignore_eos=rng.random() < 0.6, speculative_method=rng.choice(methods),
                                    num_speculative_tokens=rng.choice([None, 1, 3]))
            rid = f"r{len(rids)}"
            seqs.append(eng.add_request(rid, prompt, params))
            rids.append(rid)
        elif r < 0.35 and rids:
            rid = rng.choice([*rids, "unknown"])
            live = rid in eng._requests
            out = eng.abort(rid)
            assert (out is not None) == live
            assert eng.abort(rid) is None  # twice: nothing left to free
        else:
            eng.step()
        _check_pool(eng)
        _check_counters(eng, seqs, admitted)
    steps = 0
    while eng.has_unfinished():  # every request ends: none waits for blocks that never come
        eng.step()
        _check_pool(eng)
        _check_counters(eng, seqs, admitted)
        steps += 1
        assert steps < 3000, (seed, eng.scheduler.waiting, eng.scheduler.running)
    bm = eng.block_manager
    assert bm.num_free_blocks == bm.num_blocks and sum(bm.ref_counts) == 0
    return eng.scheduler.num_preemptions


@pytest.mark.parametrize("chunk", range(4))
def test_random_add_abort_step_keeps_the_pool_and_counters_exact(chunk):
    preemptions = sum(_run(seed) for seed in range(chunk * 40, chunk * 40 + 40))
    assert preemptions > 0  # the fuzz does reach the preemption paths


@pytest.mark.parametrize("watermark", [0, 1, 2])
@pytest.mark.parametrize("max_num_seqs", [2, 4, 8])
def test_a_long_prompt_is_not_starved_by_a_stream_of_short_ones(watermark, max_num_seqs):
    """A prompt that needs 9 of the 10 blocks, behind running requests and followed by a new short
    request every step: FCFS admission keeps the short ones behind it, so it starts as soon as
    the ones before it are done."""
    eng = make_engine(10, max_num_seqs=max_num_seqs, budget=8)
    eng.scheduler.watermark_blocks = watermark
    short = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    for i in range(3):
        eng.add_request(f"s{i}", [1, 2], short)
    eng.step()
    eng.add_request("long", [i % 20 + 1 for i in range(36)],
                    SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    for steps in range(1, 40):
        eng.add_request(f"s{steps + 2}", [1, 2 + steps % 5], short)
        eng.step()
        _check_pool(eng)
        if "long" not in eng._requests:
            break
    assert "long" not in eng._requests, f"still waiting after {steps} steps"
