"""Engine edges (review 16), on the real engine code around the KV-honest fake model
(test_fuzz_fake_batching8): load_report() while a preempted request recomputes in chunks, and a
draft model's prefill for requests that can never draft."""

from __future__ import annotations

from cloud_server.engine.sampling_params import SamplingParams

from .test_fuzz_fake_batching8 import make_engine


def _preempt_one(eng):
    params = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    for i in range(3):
        eng.add_request(f"r{i}", [1, 2, 3, 4, 5], params)
    for _ in range(40):
        eng.step()
        if eng.scheduler.num_preemptions:
            break
    (seq,) = eng.scheduler.waiting
    return seq


def test_load_report_counts_a_comeback_that_recomputes_in_chunks():
    eng = make_engine(6, budget=64)  # 24 slots: three 5-token prompts growing to 19 tokens preempt
    seq = _preempt_one(eng)
    for s in list(eng.scheduler.running):  # the comeback runs alone, recomputing 2 tokens a step
        eng.abort(s.request_id)
    eng.block_manager.reset_prefix_cache()
    eng.scheduler.max_num_batched_tokens = 2
    todo = seq.num_tokens - 1  # prompt and every output but the last
    assert todo > 4 and seq.num_output_tokens > 1
    eng.step()
    assert seq in eng.scheduler.running and seq.num_computed_tokens == 2
    report = eng.load_report()
    # was num_prompt_tokens - num_computed_tokens = 1: the outputs still to recompute vanished
    # from the load the moment the request ran again
    assert report["prefill_tokens"] == todo - 2
    assert report["decode_tokens"] == 14 - seq.num_output_tokens
    assert report["outstanding_tokens"] == report["prefill_tokens"] + report["decode_tokens"]
    while seq.num_computed_tokens < todo:
        eng.step()
        assert eng.load_report()["prefill_tokens"] == max(0, todo - seq.num_computed_tokens)
    while eng.has_unfinished():
        eng.step()
    assert eng.load_report() == {"outstanding_tokens": 0, "prefill_tokens": 0, "decode_tokens": 0,
                                 "prefix_hashes": eng.block_manager.cached_block_hashes()}
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def _draft_calls(max_tokens: int, prompt_len: int = 10):
    eng = make_engine(16, draft=True)
    calls = []
    runner = eng.spec.draft.runner
    execute = runner.execute

    def counting(scheduled, **kw):
        calls.append([(s.seq.num_computed_tokens, s.num_new_tokens) for s in scheduled])
        return execute(scheduled, **kw)

    runner.execute = counting
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            speculative_method="draft", num_speculative_tokens=3)
    (res,) = eng.generate([list(range(1, prompt_len + 1))], params)
    assert len(res.token_ids) == max_tokens and res.finish_reason == "length"
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    return calls, eng


def test_no_draft_prefill_for_requests_that_never_draft():
    # max_tokens 1 or 2: lookahead() never gives a draft slot (k <= max_tokens - outputs - 1 with
    # one output at least), yet the draft model prefilled the whole prompt (9 of its 10 tokens)
    for max_tokens in (1, 2):
        calls, eng = _draft_calls(max_tokens)
        assert calls == [] and eng.spec.stats.num_drafts == 0
    # one token more and it drafts: the prefill runs alongside the target's, as before
    calls, eng = _draft_calls(3)
    assert calls[0] == [(0, 9)] and eng.spec.stats.num_drafts == 1

