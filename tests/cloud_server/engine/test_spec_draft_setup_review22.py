"""Draft-model set-up on the real SmolLM2 engine (moved from ``test_spec_decode.py``, which
passed 400 lines): the draft prefills beside the target only while speculation would be on, and
a draft with another vocabulary is a clear start-up error."""

from __future__ import annotations

import pytest

from .pools import small_pool
from .test_spec_decode import _prompts

pytestmark = pytest.mark.real


def test_the_draft_prefills_with_the_target_unless_the_server_is_busy(smollm2_engine):
    """``SpecDecoder.prefill`` runs the draft over a prefill chunk (all but the prompt's last
    token), at most ``budget`` tokens a step, and not at all with as many running sequences as
    turn speculation off (9 of 16 draft rows); plain and prompt-lookup requests never."""
    from cloud_server.engine.model_runner import ModelRunner
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.spec_decode.draft import DraftProposer

    eng = smollm2_engine
    prompt = _prompts(eng.tokenizer)[0]
    with small_pool(eng, 40):
        eng.spec.draft = DraftProposer(ModelRunner(
            eng.runner.model, eng.model_config, num_blocks=40, block_size=eng.block_manager.block_size,
            device=eng.device, dtype=eng.dtype))
        try:
            for rid, method in (("d", "draft"), ("n", "ngram"), ("p", "none")):
                eng.add_request(rid, prompt, SamplingParams(
                    temperature=0.0, max_tokens=8, speculative_method=method, num_speculative_tokens=3))
            sched = eng.scheduler.schedule(eng.spec.lookahead)
            assert [s.num_new_tokens for s in sched.scheduled][0] == len(prompt)
            seq = sched.scheduled[0].seq
            bm = eng.block_manager
            assert eng.spec.prefill(sched.scheduled, bm, num_running=9, budget=512) == []
            assert [s.num_draft_computed_tokens for s in eng.scheduler.running] == [0, 0, 0]
            assert eng.spec.prefill(sched.scheduled, bm, num_running=3, budget=40) == [seq]
            assert seq.num_draft_computed_tokens == 40
            assert eng.spec.prefill(sched.scheduled, bm, num_running=3, budget=512) == [seq]
            assert [s.num_draft_computed_tokens for s in eng.scheduler.running] == [len(prompt) - 1, 0, 0]
            assert eng.spec.prefill(sched.scheduled, bm, num_running=3, budget=512) == []  # done
        finally:
            for rid in ("d", "n", "p"):
                eng.abort(rid)
            eng.spec.draft = None
        assert eng.block_manager.num_free_blocks == 40


def test_a_draft_with_another_vocabulary_is_a_clear_error(smollm2_engine):
    from types import SimpleNamespace

    from cloud_server.engine.spec_setup import _check_same_tokenizer, _token_count
    from cloud_server.exceptions import ConfigError

    eng = smollm2_engine

    class Wider:  # the target's tokenizer with 7 ids more
        vocab_size = _token_count(eng.tokenizer, eng.model_config) + 7

        def __getattr__(self, name: str):
            return getattr(eng.tokenizer, name)

    other = SimpleNamespace(config=eng.model_config, tokenizer=Wider())
    with pytest.raises(ConfigError, match="vocabulary"):
        _check_same_tokenizer(eng, other)
    same = SimpleNamespace(config=eng.model_config, tokenizer=eng.tokenizer)
    _check_same_tokenizer(eng, same)  # the same tokenizer passes
    # the same tokenizer with an embedding padded to more rows (as Qwen2.5's sizes differ) passes
    padded = SimpleNamespace(config=SimpleNamespace(vocab_size=eng.model_config.vocab_size + 7),
                             tokenizer=eng.tokenizer)
    _check_same_tokenizer(eng, padded)
