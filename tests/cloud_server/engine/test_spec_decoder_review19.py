"""Speculative decoding through ``SpecDecoder`` with fakes (no model): what a step keeps after
verification, the draft's KV after rejection, the counters, and the rejection rule over a mixed
batch (draft-model rows beside prompt-lookup rows, a one-hot target, drafts the target rules out)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from cloud_server.engine.block_manager import BlockManager
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.scheduler import ScheduledSeq, Scheduler
from cloud_server.engine.sequence import Sequence
from cloud_server.engine.spec_decode import SpecDecoder
from cloud_server.engine.spec_decode.draft import DraftProposer

V = 5


class _FakeDraftRunner:
    """A draft 'model' that proposes last token + 1 and keeps a fake KV cache (position -> the
    token it was fed there): every step checks the KV it reads matches the sequence's tokens."""

    def __init__(self) -> None:
        self.sampler = SimpleNamespace(stream=0)
        self.kv: dict[int, dict[int, int]] = {}
        self.fed: list[tuple[int, list[int]]] = []

    def execute(self, step, return_probs=False):
        tokens, probs = {}, {}
        for s in step:
            v, start = s.seq, s.seq.num_computed_tokens
            ids = v.token_ids[start : start + s.num_new_tokens]
            self.fed.append((start, list(ids)))
            kv = self.kv.setdefault(v.seq_id, {})
            kv.update({start + j: t for j, t in enumerate(ids)})
            # attention reads positions 0..end: none may hold a token the sequence no longer has
            assert [kv.get(i) for i in range(start + len(ids))] == v.token_ids[: start + len(ids)]
            if start + len(ids) == v.num_tokens:
                tokens[v.seq_id] = [(ids[-1] + 1) % V]
                probs[v.seq_id] = torch.full((1, V), 1.0 / V)
        return SimpleNamespace(tokens=tokens, probs=probs if return_probs else None)

    def release(self, seq_id: int) -> None:
        pass


def _decoding(bm: BlockManager, sch: Scheduler, params: SamplingParams) -> Sequence:
    seq = Sequence("r", [1, 2, 3, 4, 0], params)
    bm.append_slots(seq, 5)
    seq.num_computed_tokens = 5
    seq.token_ids.append(1)  # the sampled token, not yet computed
    seq.status = seq.status.RUNNING
    sch.running.append(seq)
    return seq


def test_draft_probabilities_do_not_outlive_their_step():
    """q of a step's draft-model drafts was kept on the decoder until the next proposal: every
    drafting sequence's [k, vocab] rows (on the GPU: up to 16 x 152k floats) stayed referenced
    after the step, after the request ended and while the server sat idle."""
    bm = BlockManager(16, 4)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    spec = SpecDecoder(method="draft", num_speculative_tokens=2, max_model_len=64,
                       draft=DraftProposer(_FakeDraftRunner()))
    seq = _decoding(bm, sch, SamplingParams(max_tokens=40, temperature=1.0, seed=3))
    out = sch.schedule(spec.lookahead)
    drafts = spec.propose(out.scheduled, bm)
    sch.add_drafts(out.scheduled, drafts)
    (item,) = out.scheduled
    assert item.num_lookahead == 2 and seq.seq_id in spec._draft_probs
    p = {seq.seq_id: torch.full((3, V), 1.0 / V)}  # p == q: every draft is accepted
    gen = torch.Generator().manual_seed(0)
    new, rejected = spec.verify(out.scheduled, {seq.seq_id: [0, 0, 4]}, p, lambda s: gen)
    assert rejected == {seq.seq_id: 0} and new == {seq.seq_id: [4]}
    assert spec._draft_probs == {}
    # and a fresh decoder verifies a sampled prompt-lookup step without a proposal first
    fresh = SpecDecoder(method="ngram", num_speculative_tokens=2, max_model_len=64)
    s2 = Sequence("r", [1, 2, 3, 4, 2, 2], SamplingParams(temperature=1.0))
    new, rejected = fresh.verify([ScheduledSeq(s2, 3, num_lookahead=2)], {s2.seq_id: [2, 2, 3]},
                                 {s2.seq_id: torch.full((3, V), 1.0 / V)}, lambda s: gen)
    assert s2.seq_id in new and 0 <= rejected[s2.seq_id] <= 2


def test_the_draft_never_reads_a_rejected_token_and_counters_stay_in_range():
    bm = BlockManager(16, 4)
    sch = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    runner = _FakeDraftRunner()
    spec = SpecDecoder(method="draft", num_speculative_tokens=3, max_model_len=64,
                       draft=DraftProposer(runner))
    seq = _decoding(bm, sch, SamplingParams(max_tokens=40, temperature=0))
    for right in (1, 3, 0, 2, 3):  # the target agrees with the first `right` drafts
        out = sch.schedule(spec.lookahead)
        proposed = spec.propose(out.scheduled, bm)
        sch.add_drafts(out.scheduled, proposed)
        drafts = proposed[seq.seq_id]
        k = out.scheduled[0].num_lookahead
        assert k == 3
        target = drafts[:right] + [(drafts[right] + 2) % V if right < k else 3]
        target += [0] * (k + 1 - len(target))
        new, rejected = spec.verify(out.scheduled, {seq.seq_id: target}, None, None)
        sch.update(out.scheduled, new, rejected)
        before = seq.num_tokens - 1 - right  # the tokens before this step's accepted drafts
        assert seq.token_ids[before:] == drafts[:right] + [target[right]]
        assert seq.num_draft_computed_tokens <= seq.num_computed_tokens == seq.num_tokens - 1
    st = spec.stats
    assert (st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens) == (5, 15, 9)
    assert st.accepted_per_pos == [4, 3, 2]
    assert 1.0 <= st.mean_acceptance_length <= 1.0 + 3
    # each proposal fed the draft only what its KV lacked (the assert in the fake checks the rest)
    assert runner.fed[0] == (0, [1, 2, 3, 4, 0, 1])


def test_a_mixed_batch_keeps_the_targets_distribution_at_every_position():
    """Draft-model rows (q) beside prompt-lookup rows (one-hot q on token 4), 1 or 2 drafts per
    row; the target is one-hot at position 0, general at 1, and rules out the draft's favourite
    token at 2. Every emitted token must follow p at its position."""
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0],
                      [0.05, 0.40, 0.10, 0.30, 0.15],
                      [0.0, 0.5, 0.0, 0.5, 0.0]])
    q = torch.tensor([[0.50, 0.05, 0.30, 0.05, 0.10],
                      [0.0, 0.1, 0.1, 0.0, 0.8]])
    g = torch.Generator().manual_seed(0)
    spec = SpecDecoder(method="draft", num_speculative_tokens=2, max_model_len=64)
    spec._draft_probs = {}  # what propose() leaves for verify(): q of the draft-model rows
    items, probs, tokens = [], {}, {}
    for r in range(6000):
        k = 1 + r % 2
        seq = Sequence("r", [1, 2, 3], SamplingParams(temperature=1.0))
        if r % 3 == 0:  # prompt lookup: the drafts are fixed, q one-hot
            d = [4] * k
        else:
            d = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(k)]
            spec._draft_probs[seq.seq_id] = q[:k].clone()
        seq.token_ids += [0] + d
        items.append(ScheduledSeq(seq, 1 + k, num_lookahead=k))
        probs[seq.seq_id] = p[: k + 1].clone()
        tokens[seq.seq_id] = [0] * k + [int(torch.multinomial(p[k], 1, generator=g))]  # bonus
    gen = torch.Generator().manual_seed(1)
    new, rejected = spec.verify(items, tokens, probs, lambda s: gen)
    counts = torch.zeros(3, V)
    for it in items:
        sid, k = it.seq.seq_id, it.num_lookahead
        a = k - rejected[sid]
        assert 0 <= a <= k
        for i, t in enumerate(it.seq.token_ids[4 : 4 + a] + new[sid]):
            counts[i, t] += 1
    assert counts[0].tolist() == [0, 0, 6000, 0, 0]  # one-hot target: always its token
    freq = counts[1] / counts[1].sum()
    assert counts[1].sum() > 1000 and 0.5 * (freq - p[1]).abs().sum() < 0.05
    assert counts[2, [0, 2, 4]].sum() == 0  # never a token the target rules out
    st = spec.stats
    assert st.num_accepted_tokens <= st.num_draft_tokens == 9000 and st.num_drafts == 6000
