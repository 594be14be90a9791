"""Sampler and speculative-decoding review: defects each shown by a test that failed before.

1. A seeded request's draft model drew the target's own random numbers (both samplers seeded
   their per-request generator with ``params.seed``), so the draft's next proposal read the
   noise of the target's last bonus token: drafts were no longer d ~ q, and the emitted tokens
   were no longer distributed as the target's p (far too many repeats).
2. A row whose logits hold a NaN emitted the NaN's id under greedy decoding (argmax reads NaN
   as the largest value) instead of failing like a sampled row.
3. A top_p = 1 row batched with a top_p < 1 row went through the top-p filter too: a float
   cumsum that reaches 1 before the tail cut tokens from it that it keeps when alone, so its
   distribution (and a seeded request's tokens) depended on its batch.
"""

from __future__ import annotations

import types

import pytest
import torch

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.scheduler import ScheduledSeq
from cloud_server.engine.sequence import Sequence
from cloud_server.engine.spec_decode import SpecDecoder
from cloud_server.engine.spec_decode.draft import DraftProposer
from cloud_server.layers.sampler import Sampler

CPU = torch.device("cpu")


def _draft_sampler() -> Sampler:
    """The draft's sampler as the engine wires it: its runner's, seed + 1, under DraftProposer."""
    return DraftProposer(types.SimpleNamespace(sampler=Sampler(seed=1))).runner.sampler


def test_a_seeded_requests_draft_draws_apart_from_the_target():
    target, draft = Sampler(seed=0), _draft_sampler()
    for seed in (0, 7, -1, 2**64 - 1):
        params = SamplingParams(seed=seed)
        t = torch.empty(64).exponential_(generator=target.generator(1, params, CPU))
        d = torch.empty(64).exponential_(generator=draft.generator(1, params, CPU))
        assert not torch.equal(t, d)
    # the target's own stream is still the request's seed as given (reproducible as before)
    t = torch.rand(4, generator=Sampler(seed=0).generator(2, SamplingParams(seed=7), CPU))
    assert torch.equal(t, torch.rand(4, generator=torch.Generator().manual_seed(7)))


def test_seeded_draft_model_speculation_emits_the_targets_distribution():
    """A context-free target p and draft q, k = 1, 4,000 seeded requests for two steps through
    the real samplers and SpecDecoder.verify: emitted tokens must be i.i.d. p, so two in a row
    agree with probability sum(p^2). With one stream per seed they agreed 0.40 of the time
    against 0.32 (16 standard errors here)."""
    vocab, n = 4, 4000
    p_logits = torch.tensor([1.0, 0.5, 0.0, -0.5])
    q_logits = torch.tensor([0.0, 0.8, 0.3, 0.0])
    p = torch.softmax(p_logits, 0)
    target, draft = Sampler(seed=0), _draft_sampler()
    spec = SpecDecoder(method="draft", num_speculative_tokens=1, max_model_len=1 << 20)
    seqs = [Sequence(f"r{i}", [0], SamplingParams(temperature=1.0, seed=i)) for i in range(n)]
    ids, params = [s.seq_id for s in seqs], [s.params for s in seqs]
    emitted: dict[int, list[int]] = {s.seq_id: [] for s in seqs}
    for _ in range(2):
        d = draft(q_logits.expand(n, vocab).clone(), ids, params, return_probs=True)
        for s, tok in zip(seqs, d.tokens, strict=True):
            s.token_ids.append(tok)
        spec._draft_probs = {sid: d.probs[i : i + 1] for i, sid in enumerate(ids)}
        t = target(p_logits.expand(2 * n, vocab).clone(), [i for i in ids for _ in "ab"],
                   [x for x in params for _ in "ab"], return_probs=True)
        tokens = {sid: t.tokens[2 * i : 2 * i + 2] for i, sid in enumerate(ids)}
        probs = {sid: t.probs[2 * i : 2 * i + 2] for i, sid in enumerate(ids)}
        items = [ScheduledSeq(s, 2, num_lookahead=1) for s in seqs]
        new, rejected = spec.verify(items, tokens, probs,
                                    lambda seq: target.generator(seq.seq_id, seq.params, CPU))
        for s in seqs:
            if rejected[s.seq_id]:
                del s.token_ids[-1]
            else:
                emitted[s.seq_id].append(s.token_ids[-1])
            s.token_ids += new[s.seq_id]
            emitted[s.seq_id] += new[s.seq_id]
    pairs = [(a, b) for e in emitted.values() for a, b in zip(e[:-1], e[1:], strict=True)]
    repeat = sum(a == b for a, b in pairs) / len(pairs)
    expected = float((p * p).sum())
    se = (expected * (1 - expected) / len(pairs)) ** 0.5
    assert abs(repeat - expected) < 5 * se, (repeat, expected, se)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_nan_row_fails_alone_and_never_emits_the_nans_id(temperature):
    logits = torch.tensor([[0.0, float("nan"), 1.0, 0.5], [0.0, 3.0, 1.0, 0.5]])
    params = [SamplingParams(temperature=temperature, seed=3), SamplingParams(temperature=0.0)]
    for return_probs in (False, True):
        out = Sampler(seed=0)(logits, [1, 2], params, return_probs=return_probs)
        assert isinstance(out.tokens[0], ValueError)  # greedy: it was token 1, the NaN's id
        assert out.tokens[1] == 1  # the healthy row still gets its token


def test_a_top_p_one_row_is_the_same_alone_and_beside_a_top_p_row():
    """Three equal logits make the float cumsum reach 1.0 before the fourth, tiny token: a
    top_p < 1 batch-mate used to cut that token from the top_p = 1 row."""
    row = torch.tensor([[0.0, 0.0, 0.0, -30.0]])
    off = SamplingParams(temperature=1.0, top_p=1.0, seed=5)
    on = SamplingParams(temperature=1.0, top_p=0.5, seed=6)
    alone = Sampler(seed=0)(row, [1], [off], return_probs=True)
    batched = Sampler(seed=0)(torch.cat([row, row]), [1, 2], [off, on], return_probs=True)
    assert alone.probs[0, 3] > 0
    assert torch.equal(batched.probs[0], alone.probs[0])
    assert batched.tokens[0] == alone.tokens[0]
    # the top_p row itself is still filtered: its smallest set reaching 0.5 is two tokens
    assert int((batched.probs[1] > 0).sum()) == 2
