"""Sampler review 17: defects each shown by a test that failed before, plus batch-invariance guards.

1. top_p sorted the probabilities with an unstable sort, so a cut through tied tokens kept an
   arbitrary one of them: with 29 equal top logits, top_p = 1e-9 (at most one token) kept id 66
   where greedy decoding picks id 3, and a cut keeping two of the tie kept two arbitrary ids.
"""

from __future__ import annotations

import itertools

import torch

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.layers.sampler import Sampler

V = 200


def _tied() -> torch.Tensor:
    """[1, V]: 29 tokens (ids 3, 10, 17, ...) tie at the top, the rest far below."""
    x = torch.zeros(1, V)
    x[0, 3::7] = 4.0
    return x


def test_a_tiny_top_p_through_a_tie_keeps_the_token_greedy_picks():
    x = _tied()
    greedy = Sampler()(x, [1], [SamplingParams(temperature=0.0)]).tokens
    assert greedy == [3]
    for temperature in (1e-5, 1.0, 5.0):
        params = SamplingParams(temperature=temperature, top_p=1e-9, seed=1)
        out = Sampler()(x, [1], [params], return_probs=True)
        assert out.tokens == [3]  # was 66
        assert out.probs[0].nonzero().flatten().tolist() == [3]


def test_a_top_p_cut_through_a_tie_keeps_the_lowest_ids_in_every_row():
    x = _tied()
    tied = x[0].nonzero().flatten().tolist()
    # each tied token holds ~1/29 of the mass (the others ~e^-4 of it): top_p 0.06 keeps two
    params = [
        SamplingParams(temperature=1.0, top_p=0.06, seed=2),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_p=0.06),
    ]
    out = Sampler()(torch.cat([x, x, x]), [1, 2, 3], params, return_probs=True)
    for row in (0, 2):
        assert out.probs[row].nonzero().flatten().tolist() == tied[:2]
        assert out.tokens[row] in tied[:2]
    assert out.tokens[1] == 3


def test_a_seeded_request_draws_the_same_tokens_whatever_its_batch():
    """Guard: position, batch size, batch-mates' settings and seeds, return_probs, NaN mates."""
    torch.manual_seed(0)
    logits = torch.randn(5, 64) * 3
    me = SamplingParams(temperature=0.8, top_k=10, top_p=0.9, seed=1234)
    ref_sampler = Sampler(seed=7)
    ref = [ref_sampler(logits[t : t + 1], [42], [me]).tokens[0] for t in range(5)]
    mates = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=1.0, seed=1234),  # the same seed, another request
        SamplingParams(temperature=0.3, top_k=1),
        SamplingParams(temperature=2.0, top_p=0.1),
    ]
    nan_row = torch.full((64,), float("nan"))
    for n, return_probs in itertools.product((1, 2), (False, True)):
        for combo in itertools.combinations(mates, n):
            for pos in range(n + 1):
                sampler, got = Sampler(seed=3), []
                for t in range(5):
                    params = list(combo)
                    params.insert(pos, me)
                    ids = [100 + j for j in range(n)]
                    ids.insert(pos, 42)
                    # a mate's row is NaN at step 2: the batch is retried row by row
                    rows = [logits[t] if j == pos else (nan_row if t == 2 else logits[(t + j + 1) % 5])
                            for j in range(n + 1)]
                    out = sampler(torch.stack(rows), ids, params, return_probs=return_probs)
                    got.append(out.tokens[pos])
                assert got == ref, (n, pos, return_probs, combo)


def test_edge_settings_keep_a_distribution_in_each_row():
    """Guard: top_k past the vocabulary is off, top_k 1 keeps one, masked tokens are never drawn."""
    logits = torch.tensor([[1.0, 2.0, 3.0, float("-inf")], [float("-inf")] * 3 + [0.5]])
    for k, kept in ((1, 1), (3, 3), (4, 3), (10**9, 3)):
        out = Sampler()(logits, [1, 2], [SamplingParams(temperature=1e-5 if k == 1 else 1.0, top_k=k)] * 2,
                        return_probs=True)
        assert int((out.probs[0] > 0).sum()) == kept
        assert out.probs[0, 3] == 0 and out.tokens[1] == 3
        assert torch.isfinite(out.probs).all()
