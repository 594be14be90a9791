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


def test_rows_verified_together_are_bit_for_bit_lone_decodes(smollm2_engine):
    """Three sequences in one step: 6 rows (5 drafts), 1 row and 3 rows (2 drafts). On CPU the
    drafting sequences attend as groups over one gathered context each (padded to 6 query
    slots); every row's logits must equal, bit for bit, those a lone decode of the same position
    gives."""
    import torch

    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.scheduler import ScheduledSeq
    from cloud_server.engine.sequence import Sequence

    eng = smollm2_engine
    bm, runner = eng.block_manager, eng.runner
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    questions = ["List three animals.", "What is 7 times 8?", "Name a color of the sky."]
    prompts = [eng.tokenizer.encode(eng.tokenizer.apply_chat_template([{"role": "user", "content": q}]))
               for q in questions]
    rows = [6, 1, 3]
    seen: list = []  # (logits, attention metadata) of each step

    def step(items):
        out = runner.execute(items)
        eng.scheduler.update(items, {it.seq.seq_id: out.tokens[it.seq.seq_id][-1:] for it in items})
        return out

    def prefill(seq):
        bm.append_slots(seq, seq.num_tokens)
        step([ScheduledSeq(seq, seq.num_tokens)])

    compute_logits, prepare = runner.model.compute_logits, runner.prepare
    runner.model.compute_logits = lambda h, **kw: (lambda y: seen.append(y) or y)(compute_logits(h, **kw))
    runner.prepare = lambda items: (lambda out: seen.append(out[2]) or out)(prepare(items))
    seqs = []
    try:
        # lone decodes: the reference tokens and each position's logits
        ref_tokens, ref_logits = [], []
        for prompt, r in zip(prompts, rows, strict=True):
            seq = Sequence("lone", prompt, params)
            seqs.append(seq)
            prefill(seq)
            logits = []
            for _ in range(r):
                bm.append_slots(seq, 1)
                step([ScheduledSeq(seq, 1)])
                logits.append(seen[-1][0])
            ref_tokens.append(seq.token_ids[len(prompt) : len(prompt) + r])
            ref_logits.append(torch.stack(logits))
        for seq in seqs:
            bm.free(seq)
        seqs = []
        # the same positions in one step: each sequence's first token and its next r - 1 as drafts
        items = []
        for prompt, r, toks in zip(prompts, rows, ref_tokens, strict=True):
            seq = Sequence("batched", prompt, params)
            seqs.append(seq)
            prefill(seq)
            assert seq.token_ids[-1] == toks[0]
            seq.token_ids.extend(toks[1:])
            bm.append_slots(seq, r)
            items.append(ScheduledSeq(seq, r, num_lookahead=r - 1))
        seen.clear()
        runner.execute(items)
        meta, logits = seen
        assert meta.decode_groups is not None and meta.decode_groups.queries == 6
        assert torch.equal(logits, torch.cat(ref_logits))  # rows in step order: 6, 1, 3
    finally:
        runner.model.compute_logits, runner.prepare = compute_logits, prepare
        for seq in seqs:
            bm.free(seq)
    assert bm.num_free_blocks == bm.num_blocks
