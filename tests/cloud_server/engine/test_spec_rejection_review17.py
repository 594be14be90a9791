"""The rejection rule on a 5-token vocabulary: every emitted token is distributed as the target's
p, whatever the draft's q (fixed seeds, many rows in one batch: the bounds are deterministic)."""

from __future__ import annotations

import torch

from cloud_server.engine.spec_decode.rejection import verify_sampled

V = 5
N = 200_000  # rows: the TV distance of an exact sampler stays ~0.003 here


def _tv(tokens: torch.Tensor, p: torch.Tensor) -> float:
    freq = torch.bincount(tokens, minlength=V).double() / tokens.numel()
    return 0.5 * (freq - p.double()).abs().sum().item()


def _run(p: torch.Tensor, q: torch.Tensor | None, k: int, seed: int = 0):
    """N sequences with k drafts each drawn from q (or, q None, fixed at token 4), target p at
    every position; returns (accepted, token) as the engine would use them."""
    g = torch.Generator().manual_seed(seed)
    target = p.expand(N, k + 1, V).contiguous()
    if q is None:
        drafts = torch.full((N, k), 4, dtype=torch.long)
        draft_probs = None
    else:
        drafts = torch.multinomial(q, N * k, replacement=True, generator=g).view(N, k)
        draft_probs = q.expand(N, k, V).contiguous()
    bonus = torch.multinomial(p, N, replacement=True, generator=g)
    uniforms = torch.rand(N, k + 1, generator=g)
    accepted, token = verify_sampled(
        drafts, torch.full((N,), k), target, draft_probs, bonus, uniforms
    )
    return drafts, accepted, token


def _first_token(drafts, accepted, token):
    return torch.where(accepted > 0, drafts[:, 0], token)


P = torch.tensor([0.05, 0.40, 0.10, 0.30, 0.15])
Q = torch.tensor([0.50, 0.05, 0.30, 0.05, 0.10])  # far from P: a wrong rule shows at once


def test_the_first_token_is_distributed_as_the_target():
    drafts, accepted, token = _run(P, Q, 1)
    assert _tv(_first_token(drafts, accepted, token), P) < 0.01
    # acceptance rate is sum(min(p, q)) (Leviathan et al., Theorem 3.5)
    assert abs(accepted.float().mean().item() - torch.minimum(P, Q).sum().item()) < 0.01


def test_every_position_is_distributed_as_the_target():
    k = 3
    drafts, accepted, token = _run(P, Q, k, seed=1)
    for i in range(k + 1):
        # the token at position i: draft i if accepted past it, else the emitted one if a == i
        reached = accepted >= i
        tok = torch.where(accepted[reached] > i, drafts[reached, min(i, k - 1)], token[reached])
        assert reached.sum() > 5_000
        assert _tv(tok, P) < 0.02, i


def test_prompt_lookup_one_hot_draft():
    drafts, accepted, token = _run(P, None, 2, seed=2)
    assert abs(accepted.gt(0).float().mean().item() - P[4].item()) < 0.01
    assert _tv(_first_token(drafts, accepted, token), P) < 0.01
    # a rejected lookup draft never comes back as the correction
    assert not torch.any((accepted == 0) & (token == 4))


def test_target_zeros_are_never_emitted_and_a_zero_draft_prob_is_accepted():
    p = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])  # top-k 2 on the target
    q = torch.tensor([0.4, 0.1, 0.4, 0.1, 0.0])
    drafts, accepted, token = _run(p, q, 2, seed=3)
    emitted = torch.cat([drafts[accepted > 0, 0], token])
    assert set(emitted.unique().tolist()) <= {1, 3}
    assert _tv(_first_token(drafts, accepted, token), p) < 0.01
    # q(d) = 0 for the drafted token (a cut draft head): min(1, p / 0) = 1, always accepted
    d = torch.tensor([[1]])
    a, _ = verify_sampled(
        d, torch.tensor([1]), p.expand(1, 2, V), q.expand(1, 1, V).clone().index_fill_(2, d[0], 0.0),
        torch.tensor([3]), torch.tensor([[0.999, 0.5]]),
    )
    assert a.tolist() == [1]


def test_equal_distributions_accept_everything():
    u = torch.full((V,), 1.0 / V)
    drafts, accepted, token = _run(u, u, 4, seed=4)
    assert torch.all(accepted == 4)
    assert _tv(token, u) < 0.01  # the bonus, drawn from p
