"""LLMEngine's offline and reporting edges, on the real engine code around the KV-honest fake model
(test_fuzz_fake_batching8): generate() past the waiting queue's bound, a failed request's reason in
generate()'s results, refused inputs, and load_report() for preempted requests."""

from __future__ import annotations

import pytest

from cloud_server.engine.model_runner import StepResult
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import ContextLengthError, InvalidRequestError

from .test_fuzz_fake_batching8 import _alone, make_engine

_GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def test_generate_runs_more_prompts_than_the_waiting_queue_holds():
    # 2 batch slots + 3 waiting places: the 6th add_request was a QueueFullError, and generate()
    # aborted the five it had added
    eng = make_engine(16, max_num_seqs=2)
    eng.scheduler.max_waiting = 3
    prompts = [[1 + i % 20, 2, 3 + i % 5] for i in range(12)]
    results = eng.generate(prompts, _GREEDY)
    for prompt, res in zip(prompts, results, strict=True):
        alone = _alone(prompt, _GREEDY, draft=False, max_len=40)
        assert (res.token_ids, res.text, res.finish_reason) == alone
        assert res.num_prompt_tokens == len(prompt)
    bm = eng.block_manager
    assert not eng.has_unfinished() and bm.num_free_blocks == bm.num_blocks


def test_generate_checks_every_prompt_before_running_any():
    eng = make_engine(16, max_num_seqs=1)
    eng.scheduler.max_waiting = 1
    too_long = list(range(1, 21)) * 2  # 40 tokens + max_tokens 6 > max_model_len 40
    with pytest.raises(ContextLengthError):
        eng.generate([[1, 2], [3, 4], [5, 6], too_long], _GREEDY)
    assert eng._steps == 0 and not eng.has_unfinished()
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_generate_tells_why_a_request_failed():
    eng = make_engine(16)
    execute = eng.runner.execute
    victim = {}

    def failing(scheduled, **kw):  # the sampler fails one row, as for logits that are all -inf
        result = execute(scheduled, **kw)
        for item in scheduled:
            if item.seq.request_id == victim.get("rid") and item.seq.seq_id in result.tokens:
                result.tokens[item.seq.seq_id] = ValueError("no finite logit in the row")
        return StepResult(result.tokens, result.probs)

    eng.runner.execute = failing
    real_add = eng.add_request

    def add(rid, prompt, params=None):
        seq = real_add(rid, prompt, params)
        victim.setdefault("rid", rid)
        return seq

    eng.add_request = add
    bad, good = eng.generate([[1, 2, 3], [4, 5, 6]], _GREEDY)
    assert bad.finish_reason == "error"
    assert bad.error is not None and "no finite logit in the row" in bad.error
    assert good.finish_reason == "length" and good.error is None


@pytest.mark.parametrize("params", [{"max_tokens": 3}, "greedy", 5])
def test_add_request_refuses_params_that_are_no_sampling_params(params):
    eng = make_engine(8)
    with pytest.raises(InvalidRequestError, match="SamplingParams"):  # was AttributeError
        eng.add_request("r", [1, 2], params)
    assert not eng.has_unfinished()
    with pytest.raises(InvalidRequestError, match="SamplingParams"):
        eng.generate([[1, 2]], [params])


@pytest.mark.parametrize("prompt", [[True, 2], [1, False]])
def test_prompt_ids_refuse_bools(prompt):
    eng = make_engine(8)
    with pytest.raises(InvalidRequestError):  # True ran as token id 1
        eng.add_request("r", prompt, _GREEDY)
    assert not eng.has_unfinished()


def test_load_report_counts_the_outputs_a_preempted_request_recomputes():
    eng = make_engine(6, budget=64)  # 24 slots: three 5-token prompts growing to 19 tokens preempt
    params = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    for i in range(3):
        eng.add_request(f"r{i}", [1, 2, 3, 4, 5], params)
    for _ in range(40):
        eng.step()
        if eng.scheduler.num_preemptions:
            break
    (seq,) = eng.scheduler.waiting
    assert seq.num_preemptions == 1 and seq.num_output_tokens > 0 and seq.num_computed_tokens == 0
    report = eng.load_report()
    running = sum(max(0, s.num_prompt_tokens - s.num_computed_tokens) for s in eng.scheduler.running)
    # its prompt and every output but the last must be prefilled again (was its prompt alone)
    assert report["prefill_tokens"] == running + seq.num_tokens - 1
    assert report["outstanding_tokens"] == report["prefill_tokens"] + report["decode_tokens"]
    # what its comeback computes before it samples again, prefix hits aside
    eng.block_manager.reset_prefix_cache()
    while eng.scheduler.waiting:
        eng.step()
    assert seq.num_computed_tokens == seq.num_tokens - 1 or seq.is_finished
