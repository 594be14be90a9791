"""Speculative decoding on plain data: prompt lookup, the greedy rule, the scheduler's draft
slots and rollback, the adaptive rule, config and request checks (no model)."""

from __future__ import annotations

import pytest

from cloud_server.config import EngineConfig
from cloud_server.engine.block_manager import BlockManager
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.scheduler import ScheduledSeq, Scheduler
from cloud_server.engine.sequence import Sequence
from cloud_server.engine.spec_decode import SpecDecoder
from cloud_server.engine.spec_decode.decoder import DEFAULT_K, _SeqState
from cloud_server.engine.spec_decode.ngram import propose_ngram
from cloud_server.engine.spec_decode.rejection import verify_greedy
from cloud_server.exceptions import ConfigError, InvalidRequestError


def test_ngram_proposes_what_followed_the_latest_longest_match():
    #        0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 8, 9, 1, 6, 7, 3, 6, 7]  # suffix [6, 7]: latest earlier match at 6
    assert propose_ngram(tokens, 3) == [3, 6, 7]
    assert propose_ngram(tokens + [8], 2) == [9, 1]  # [6, 7, 8] only matches at 1
    assert propose_ngram([1, 2, 3, 4], 3) == []  # no repeated bigram
    assert propose_ngram(tokens, 0) == []
    # no repeated bigram, but 4 occurred before: the fallback copies what followed its latest
    assert propose_ngram([4, 9, 8, 4, 7, 6, 5, 4], 5, fallback_k=2) == [7, 6]
    assert propose_ngram([1, 2, 3, 4], 3, fallback_k=2) == []  # 4 never occurred before


def test_ngram_prefers_the_copy_with_the_longer_agreeing_context():
    # two copies of the 4-gram [1, 2, 3, 4]: the later one (at 10) follows 5, the earlier one
    # (at 2) follows [8, 9]; the suffix [8, 9, 1, 2, 3, 4] agrees on 6 tokens with the earlier one
    tokens = [8, 9, 1, 2, 3, 4, 20, 21, 0, 5, 1, 2, 3, 4, 30, 31, 8, 9, 1, 2, 3, 4]
    assert propose_ngram(tokens, 2) == [20, 21]
    assert propose_ngram(tokens, 2, max_n=4) == [30, 31]  # capped at 4: the latest copy wins
    assert propose_ngram(tokens, 2, min_n=7) == []  # no copy agrees on 7


def test_greedy_rule_keeps_the_agreeing_prefix_and_the_targets_token():
    assert verify_greedy([4, 5, 6], [4, 5, 9, 1]) == [4, 5, 9]
    assert verify_greedy([4, 5, 6], [4, 5, 6, 1]) == [4, 5, 6, 1]  # all accepted + bonus
    assert verify_greedy([4, 5, 6], [7, 5, 6, 1]) == [7]


def _decoding_seq(bm: BlockManager, prompt: list[int], params: SamplingParams) -> Sequence:
    seq = Sequence("r", prompt, params)
    bm.append_slots(seq, len(prompt))
    seq.num_computed_tokens = len(prompt)
    seq.token_ids.append(99)  # the sampled token, not yet computed
    return seq


def test_rejected_drafts_are_trimmed_and_never_hashed():
    bm = BlockManager(8, 4)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    seq = _decoding_seq(bm, [1, 2, 3], SamplingParams(max_tokens=32))  # 4 tokens, 3 computed
    seq.status = seq.status.RUNNING
    sch.running.append(seq)
    out = sch.schedule(lambda s, n: 6)
    (item,) = out.scheduled
    assert item.num_spec_slots == 6 and len(seq.block_table) == 3  # 3 + 1 + 6 = 10 slots
    sch.add_drafts(out.scheduled, {seq.seq_id: [11, 12, 13, 14, 15, 16, 17]})  # one too many
    assert item.num_lookahead == 6 and item.num_new_tokens == 7 and item.samples
    # the target accepts 11, 12 and says 20 after them: 4 drafts rejected
    appended = sch.update(out.scheduled, {seq.seq_id: [20]}, {seq.seq_id: 4})
    assert appended == [(seq, [11, 12, 20])]
    assert seq.token_ids == [1, 2, 3, 99, 11, 12, 20]
    assert seq.num_computed_tokens == 6
    assert len(seq.block_table) == 2  # the third block held only rejected drafts
    assert len(seq.block_hashes) == 1  # block 0 [1, 2, 3, 99] only; block 1 is not full
    cached_tokens = [t for t in bm._block_tokens if t is not None]
    assert cached_tokens == [(1, 2, 3, 99)]
    sch.finish(seq, "abort")
    assert bm.num_free_blocks == bm.num_blocks


def test_drafts_never_preempt_and_rollback_frees_their_slots():
    bm = BlockManager(4, 4)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    params = SamplingParams(max_tokens=32)
    a = _decoding_seq(bm, [1, 2, 3], params)  # 1 block each, 2 free
    b = _decoding_seq(bm, [4, 5, 6], params)
    for s in (a, b):
        s.status = s.status.RUNNING
        sch.running.append(s)
    out = sch.schedule(lambda s, n: 8)  # 8 drafts need 2 more blocks: only one sequence gets them
    assert not out.preempted
    assert [i.num_spec_slots for i in out.scheduled] == [8, 0]
    assert bm.num_free_blocks == 0
    sch.add_drafts(out.scheduled, {a.seq_id: [9] * 8})
    sch.rollback(out.scheduled)  # the step failed
    assert a.token_ids == [1, 2, 3, 99] and len(a.block_table) == 1
    b.token_ids.append(5)  # b needs a new block for its plain step: a may not draft into it
    b.num_computed_tokens = 4
    bm.commit(b)
    out = sch.schedule(lambda s, n: 8)
    # a drafts into the one spare block; b drafts only into the block its plain step takes
    # anyway (3 slots past its token; it drafted nothing there before review 28)
    assert not out.preempted and [i.num_spec_slots for i in out.scheduled] == [4, 3]
    assert bm.num_free_blocks == 0
    for s in (a, b):
        sch.finish(s, "abort")
    assert bm.num_free_blocks == bm.num_blocks


def test_adaptive_rule_shrinks_k_with_the_batch_and_low_acceptance():
    spec = SpecDecoder(method="ngram", num_speculative_tokens=8, max_model_len=4096, max_spec_rows=16)
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 3
    seq = Sequence("r", text, SamplingParams(max_tokens=100))

    def lookahead(num_decoding):  # past the ramp: as after a draft accepted whole
        spec._state.setdefault(seq.seq_id, _SeqState()).whole = True
        return spec.lookahead(seq, num_decoding)

    assert lookahead(1) == 8
    assert lookahead(4) == 3  # (16 - 4) // 4
    assert lookahead(8) == 1
    assert lookahead(9) == 0  # a full batch decodes plainly
    seq.params.max_tokens = seq.num_output_tokens + 3
    assert lookahead(1) == 2  # 2 drafts + 1 token reach max_tokens
    seq.params.max_tokens = 100
    spec._state[seq.seq_id].acceptance = 0.05  # drafts keep failing
    ks = [spec.lookahead(seq, 1) for _ in range(8)]
    assert sum(1 for k in ks if k) == 2 and max(ks) == 1  # a 1-token probe every 4th step
    off = Sequence("r2", text, SamplingParams(max_tokens=100, speculative_method="none"))
    assert spec.lookahead(off, 1) == 0
    server_off = SpecDecoder(method=None, num_speculative_tokens=4, max_model_len=4096)
    assert server_off.lookahead(seq, 1) == 0
    per_request = Sequence(
        "r3", text, SamplingParams(max_tokens=100, speculative_method="ngram", num_speculative_tokens=2)
    )
    assert server_off.lookahead(per_request, 1) == 2


def test_prompt_lookup_ramps_up_after_a_draft_passes_whole_and_back_after_a_miss():
    spec = SpecDecoder(method="ngram", num_speculative_tokens=None, max_model_len=4096)
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 3
    seq = Sequence("r", list(text), SamplingParams(max_tokens=100))
    sid = seq.seq_id

    def step(right: int) -> int:
        """One step: lookahead, propose, the target agrees with the first ``right`` drafts."""
        k = spec.lookahead(seq, 1)
        drafts = spec.propose([ScheduledSeq(seq, 1, num_spec_slots=k)])[sid]
        seq.token_ids.extend(drafts)
        target = drafts[:right] + [(drafts[right] + 1) % 12 + 1 if right < k else 0]
        target += [0] * (k + 1 - len(target))
        _, rejected = spec.verify([ScheduledSeq(seq, 1 + k, num_lookahead=k)], {sid: target}, None, None)
        assert rejected[sid] == k - right
        seq.token_ids[:] = text  # the same periodic text again: a match every step
        return k

    assert DEFAULT_K == {"ngram": 8, "draft": 3}
    assert step(right=3) == 3  # one row block to start with; all 3 accepted
    assert step(right=2) == 8  # then the server's K (8 for prompt lookup): 2 of 8 accepted
    assert step(right=3) == 3  # a miss starts the ramp again
    assert step(right=3) == 8
    per_request = Sequence("r2", list(text), SamplingParams(max_tokens=100, num_speculative_tokens=2))
    assert spec.lookahead(per_request, 1) == 2  # a request's own K below the ramp
    draft_server = SpecDecoder(method="draft", num_speculative_tokens=None, max_model_len=4096)
    assert draft_server.lookahead(Sequence("r3", list(text), SamplingParams(max_tokens=100)), 1) == 3


def test_row_blocks_round_a_sequences_rows_down_to_whole_blocks():
    import torch

    from cloud_server.layers import cpu_kernels
    from cloud_server.layers.linear import int8_row_block

    cpu = torch.device("cpu")
    # the engine's kernels take 8 rows a pass, torch's 4 (test_int4.py checks the latter)
    assert int8_row_block(cpu, torch.bfloat16, "int8") == (4 if cpu_kernels.int4_mm() is None else 8)
    assert int8_row_block(cpu, torch.float32, "none") == 1
    assert int8_row_block(torch.device("cuda"), torch.bfloat16, "none") == 1
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 3
    seq = Sequence("r", text, SamplingParams(max_tokens=100))

    def k_for(num_speculative_tokens, num_decoding=1):
        spec = SpecDecoder(method="ngram", num_speculative_tokens=num_speculative_tokens,
                           max_model_len=4096, max_spec_rows=16, row_block=4)
        spec._state[seq.seq_id] = _SeqState(whole=True)  # past the prompt-lookup ramp
        return spec.lookahead(seq, num_decoding)

    # 1 + k rows: 5 -> 4, 4 stays, 3 and 2 stay (within one block), 9 -> 8, 8 stays
    assert [k_for(k) for k in (4, 3, 2, 1, 8, 7, 6)] == [3, 3, 2, 1, 7, 7, 3]
    assert k_for(4, num_decoding=2) == 3  # 2 sequences x 4 rows
    plain = SpecDecoder(method="ngram", num_speculative_tokens=4, max_model_len=4096)
    plain._state[seq.seq_id] = _SeqState(whole=True)
    assert plain.lookahead(seq, 1) == 4  # row_block 1: no rounding


def test_config_and_request_errors_are_clear():
    with pytest.raises(ConfigError, match="draft_model goes with EngineConfig.speculative_method draft"):
        EngineConfig("m", speculative_method="draft")
    with pytest.raises(ConfigError, match="draft_model goes with"):
        EngineConfig("m", draft_model="small")
    with pytest.raises(ConfigError, match="speculative_method"):
        EngineConfig("m", speculative_method="eagle")
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        EngineConfig("m", speculative_method="ngram", num_speculative_tokens=0)
    with pytest.raises(ConfigError, match="draft_vocab_size"):
        EngineConfig("m", speculative_method="draft", draft_model="s", draft_vocab_size=-1)
    with pytest.raises(InvalidRequestError, match="speculative_method"):
        SamplingParams(speculative_method="medusa")
    with pytest.raises(InvalidRequestError, match="num_speculative_tokens"):
        SamplingParams(num_speculative_tokens=17)


def test_cli_flags_reach_the_engine_config():
    from cloud_server.__main__ import build_parser
    from cloud_server.cli_settings import _engine_config

    args = build_parser().parse_args(
        [
            "serve",
            "--model",
            "m",
            "--speculative-method",
            "draft",
            "--num-speculative-tokens",
            "3",
            "--draft-model",
            "small",
            "--draft-vocab-size",
            "0",
        ]
    )
    config = _engine_config(args)
    assert (config.speculative_method, config.num_speculative_tokens, config.draft_model) == (
        "draft",
        3,
        "small",
    )
    assert config.draft_vocab_size == 0  # 0: the whole vocabulary, not the default (None)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model", "m", "--draft-vocab-size", "-3"])
    assert _engine_config(build_parser().parse_args(["serve", "--model", "m"])).speculative_method is None


@pytest.mark.parametrize("kind", ["float", "int8", "int4"])
def test_a_cut_head_computes_the_first_rows_exactly(kind):
    """``Linear.first_rows``: a draft head over the first n token ids gives exactly the first n
    logits of the whole head, sharing its weights (packed weights are cut at whole blocks of rows:
    64 in torch's int4 packing, 16 in the engine kernels' int4 and int8 formats)."""
    import torch

    from cloud_server.layers.linear import Linear, quantize_rows

    torch.manual_seed(0)
    out, inn = 320, 128
    full = Linear(inn, out)
    w = torch.randn(out, inn)
    if kind == "float":
        full.load(w)
    elif kind == "int8":
        q, s = quantize_rows(w)
        full.load(q, scale=s.to(torch.bfloat16))
    else:
        codes = torch.randint(0, 256, (out, inn // 2), dtype=torch.uint8)
        full.load(codes, scale=torch.randn(out, inn // 32, 2) * 0.01)
    x = torch.randn(3, inn, dtype=torch.float32 if kind == "float" else torch.bfloat16)
    y = full(x)
    block = 16 if full.blocks else 64 if full.int4 else 1
    for n, rows in ((200, 200 - 200 % block), (64, 64), (out, out), (10_000, out)):
        head = full.first_rows(n)
        assert head.out_features == rows
        assert torch.equal(head(x), y[:, :rows])
        assert head.weight.untyped_storage().data_ptr() == full.weight.untyped_storage().data_ptr()


def test_a_seeded_requests_verification_draws_do_not_depend_on_its_batch():
    """The rejection rule's uniforms come from a seeded request's own generator: it must draw
    the same numbers (and leave its generator in the same state) whether or not a sequence with
    more drafts shares the step."""
    import torch

    vocab = 8
    spec = SpecDecoder(method="ngram", num_speculative_tokens=None, max_model_len=64)
    spec.propose([])  # prompt-lookup drafts: no draft-model probabilities this step

    def item(k: int, seed: int) -> ScheduledSeq:
        seq = Sequence("r", [1, 2, 3], SamplingParams(temperature=1.0, seed=seed))
        seq.token_ids += [4] + [5] * k  # the last token, then k drafts (p = 1/8 each)
        return ScheduledSeq(seq, 1 + k, num_lookahead=k)

    def verify(items, gens):
        probs = {it.seq.seq_id: torch.full((it.num_lookahead + 1, vocab), 1 / vocab) for it in items}
        tokens = {it.seq.seq_id: [6] * (it.num_lookahead + 1) for it in items}
        new, rejected = spec.verify(items, tokens, probs, lambda seq: gens[seq.params.seed])
        return new, rejected

    for seed in range(20):
        alone, batched = item(2, seed), item(2, seed)
        gens = {seed: torch.Generator().manual_seed(seed)}
        new_alone, rej_alone = verify([alone], gens)
        after_alone = torch.rand(1, generator=gens[seed])
        gens = {seed: torch.Generator().manual_seed(seed), 1000: torch.Generator().manual_seed(1000)}
        other = item(6, 1000)
        new_b, rej_b = verify([batched, other], gens)
        assert new_b[batched.seq.seq_id] == new_alone[alone.seq.seq_id]
        assert rej_b[batched.seq.seq_id] == rej_alone[alone.seq.seq_id]
        assert torch.equal(torch.rand(1, generator=gens[seed]), after_alone)


def test_a_failed_row_keeps_none_of_its_unverified_drafts():
    """A row whose sampling failed (its request ends with an error) verified nothing: its drafts
    must be dropped, not appended as accepted tokens (which could even finish the request)."""
    bm = BlockManager(8, 4)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    seq = _decoding_seq(bm, [1, 2, 3], SamplingParams(max_tokens=32))
    seq.status = seq.status.RUNNING
    sch.running.append(seq)
    out = sch.schedule(lambda s, n: 3)
    sch.add_drafts(out.scheduled, {seq.seq_id: [11, 12, 13]})
    spec = SpecDecoder(method="ngram", num_speculative_tokens=None, max_model_len=64)
    new, rejected = spec.verify(out.scheduled, {seq.seq_id: ValueError("bad row")}, None, None)
    assert new == {} and rejected == {seq.seq_id: 3}
    assert sch.update(out.scheduled, new, rejected) == []
    assert seq.token_ids == [1, 2, 3, 99] and seq.num_computed_tokens == 4
    sch.finish(seq, "error")
    assert bm.num_free_blocks == bm.num_blocks
