"""Which drafted tokens the target model accepts: lossless speculative sampling.

For one sequence with drafts ``d_1..d_k`` the target step gives, at each of the k + 1 positions,
its token ``o_i`` (argmax, or a draw from p_i) and, when sampling, its filtered distribution p_i
(logit_bias, penalties, temperature, top-k, top-p and min-p applied exactly as without
speculation; the penalties of position i count d_1..d_i, the output if they are accepted). The
draft's distributions are q_i (for prompt lookup q_i is one-hot on d_i).

Greedy: accept d_i while d_i == o_{i-1}; then emit the target's own o_a. The result is the token
sequence plain greedy decoding gives.

Sampling (Leviathan et al. 2023, Chen et al. 2023):
    accept d_i with probability min(1, p_i(d_i) / q_i(d_i))
    at the first rejection emit t ~ norm(max(p_i - q_i, 0)) and stop
    if all k are accepted, emit the bonus o_k ~ p_k (the target step already drew it)
Each emitted token is then distributed exactly as p (the target's), whatever q is.
"""

from __future__ import annotations

import torch


def verify_greedy(drafts: list[int], outputs: list[int]) -> list[int]:
    """Accepted drafts plus the target's next token: ``outputs`` has len(drafts) + 1 entries."""
    a = 0
    while a < len(drafts) and drafts[a] == outputs[a]:
        a += 1
    return drafts[:a] + [outputs[a]]


def verify_sampled(
    drafts: torch.Tensor,  # [N, K] long, row n valid in its first num_drafts[n] entries
    num_drafts: torch.Tensor,  # [N] long, 1..K
    target_probs: torch.Tensor,  # [N, K + 1, V] p_i, filtered and normalized
    draft_probs: torch.Tensor | None,  # [N, K, V] q_i, or None for one-hot q (prompt lookup)
    bonus: torch.Tensor,  # [N] long, o_{k_n} ~ p_{k_n}, drawn by the target step
    uniforms: torch.Tensor,  # [N, K + 1] U(0, 1): K for the accept tests, 1 for a residual draw
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of sequences at once: (accepted count a [N], the token emitted after them [N])."""
    n, k = drafts.shape
    pos = torch.arange(k, device=drafts.device)  # [K]
    p_d = target_probs[:, :k].gather(2, drafts.unsqueeze(2)).squeeze(2)  # [N, K] p_i(d_i)
    if draft_probs is None:
        q_d = torch.ones_like(p_d)
    else:
        q_d = draft_probs.gather(2, drafts.unsqueeze(2)).squeeze(2)  # [N, K] q_i(d_i)
    # accept d_i when u_i < p_i(d_i) / q_i(d_i), written u * q < p (no division by 0)
    ok = (uniforms[:, :k] * q_d < p_d) & (pos < num_drafts.unsqueeze(1))  # [N, K]
    accepted = ok.long().cumprod(dim=1).sum(dim=1)  # [N] a: drafts before the first rejection
    token = bonus.clone()
    rows = torch.nonzero(accepted < num_drafts).flatten()  # [R] rejected at position a
    if rows.numel():
        a = accepted[rows]
        p = target_probs[rows, a].float()  # [R, V]
        if draft_probs is None:
            # max(p - onehot(d_a), 0): d_a loses its mass, nothing else changes
            residual = p.scatter(1, drafts[rows, a].unsqueeze(1), 0.0)
        else:
            residual = (p - draft_probs[rows, a].float()).clamp_min(0.0)  # max(p - q, 0)
        mass = residual.sum(dim=1, keepdim=True)  # [R, 1]
        # p == q up to rounding: a rejection there has probability ~0; draw from p itself
        residual = torch.where(mass > 0, residual, p)
        cdf = residual.cumsum(dim=1)  # [R, V]
        # t ~ residual / sum(residual) by the inverse CDF: first t with cdf_t > u * total
        u = uniforms[rows, k].unsqueeze(1) * cdf[:, -1:]  # [R, 1]
        t = torch.searchsorted(cdf, u, right=True).clamp_max(cdf.shape[1] - 1).squeeze(1)
        token[rows] = t
    return accepted, token
