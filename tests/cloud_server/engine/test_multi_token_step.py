"""The runner's per-position outputs: one step over a token and its lookaheads (real SmolLM2).

Greedy decoding gives a reference continuation. Then one sequence takes its first token plus five
guessed next tokens (four right, one wrong) as a single 6-token step: the outputs at the first
five positions must be the reference's next tokens, as if decoded one by one, and
``Scheduler.update`` must keep the right guesses and drop the wrong one.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.real


def test_lookahead_outputs_equal_step_by_step_decoding(smollm2_engine):
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.scheduler import ScheduledSeq
    from cloud_server.engine.sequence import Sequence

    eng = smollm2_engine
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompt = eng.tokenizer.encode(
        eng.tokenizer.apply_chat_template([{"role": "user", "content": "List three animals."}])
    )
    ref = eng.generate([prompt], params)[0].token_ids  # 8 greedy tokens

    bm, runner = eng.block_manager, eng.runner
    seq = Sequence("lookahead", prompt, params)
    try:
        bm.append_slots(seq, len(prompt))
        first = runner.execute([ScheduledSeq(seq, len(prompt))], return_probs=True)
        assert first.tokens[seq.seq_id] == [ref[0]]
        assert first.probs is not None and first.probs[seq.seq_id].shape == (1, eng.model_config.vocab_size)
        eng.scheduler.update([ScheduledSeq(seq, len(prompt))], {seq.seq_id: [ref[0]]})
        wrong = (ref[5] + 1) % eng.model_config.vocab_size
        seq.token_ids.extend([*ref[1:5], wrong])  # four right guesses, one wrong
        item = ScheduledSeq(seq, 6, num_lookahead=5)
        bm.append_slots(seq, 6)
        out = runner.execute([item]).tokens[seq.seq_id]
        assert out[:5] == ref[1:6]
        # accept ref[1..4], reject the wrong guess, take the model's token after ref[4]
        eng.scheduler.update([item], {seq.seq_id: [out[4]]}, {seq.seq_id: 1})
        assert seq.token_ids[len(prompt) :] == ref[:6]
        assert seq.num_computed_tokens == len(prompt) + 5
        assert len(seq.block_table) == bm.num_blocks_for(seq.num_computed_tokens)
    finally:
        bm.free(seq)
    assert bm.num_free_blocks == bm.num_blocks
