"""A request whose context is shorter than 16 tokens computes the same alone and batched.

Decode rows read their keys padded to the longest context of the batch (masked past their own).
torch's CPU softmax summed a row of fewer than 16 keys (its vector width) in another order than
the same row padded to a batch-mate's length, so the normalizer moved in its last bit, the bf16
probabilities with it: a 3-token prompt batched with 35-token ones got other logits from its
7th token on (by up to 0.57) and, at a near tie, another greedy token than alone. Every row now
reads at least ``MIN_KEYS`` keys (real SmolLM2 weights; the logprobs are compared bit for bit).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.real

SYSTEM = "You are a helpful assistant. Answer briefly and clearly, with facts only. " * 2


@pytest.fixture
def eng(smollm2_engine):
    engine = smollm2_engine
    engine.block_manager.reset_prefix_cache()
    yield engine
    assert not engine.has_unfinished()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def _params():
    from cloud_server.engine.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=1)


def _seen(result):
    return result.token_ids, [(e.token_id, e.logprob) for e in result.logprobs]


def test_a_short_prompt_batched_with_long_ones_matches_it_alone(eng):
    tok = eng.tokenizer
    system = tok.encode(SYSTEM)
    shorts = [system[:3], system[:2], tok.encode("Hi!")]
    longs = [system + tok.encode(q) for q in (" Why is the sky blue?", " Count to ten.")]
    alone = []
    for prompt in shorts:
        eng.block_manager.reset_prefix_cache()
        alone.append(_seen(eng.generate([prompt], _params())[0]))
    eng.block_manager.reset_prefix_cache()
    batched = eng.generate([longs[0], *shorts, longs[1]], _params())
    for prompt, want, got in zip(shorts, alone, batched[1:-1], strict=True):
        assert _seen(got) == want, prompt


def test_every_attention_row_reads_at_least_min_keys(eng):
    """The metadata itself: a lone 3-token prefill and its decode read 16 keys, the rest masked."""
    from cloud_server.engine.model_runner import MIN_KEYS
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.scheduler import ScheduledSeq
    from cloud_server.engine.sequence import Sequence

    bm = eng.block_manager
    seq = Sequence("keys", [1, 2, 3], SamplingParams(max_tokens=1))
    bm.append_slots(seq, 3)
    try:
        _, _, meta, _ = eng.runner.prepare([ScheduledSeq(seq, 3)])
        assert meta.prefills[0].gather.shape[0] == MIN_KEYS
        assert meta.prefill_mask(0, None).sum().item() == 6  # causal: 1 + 2 + 3 keys
        assert meta.slot_mapping.shape[0] == 3
        seq.num_computed_tokens = 2
        _, _, meta, _ = eng.runner.prepare([ScheduledSeq(seq, 1)])
        assert meta.decode_gather is not None and meta.decode_gather.shape[1] == MIN_KEYS
        assert meta.decode_mask(None).sum().item() == 3
    finally:
        bm.free(seq)
