"""Which drafted tokens the target model accepts: lossless speculative sampling.

For one sequence with drafts ``d_1..d_k`` the target step gives, at each of the k + 1 positions,
its token ``o_i`` (argmax, or a draw from p_i) and, when sampling, its filtered distribution p_i
(temperature, top-k and top-p applied exactly as without speculation). The draft's distributions
are q_i (for prompt lookup q_i is one-hot on d_i).

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
    drafts: list[int],
    outputs: list[int],
    target_probs: torch.Tensor,  # [k + 1, V] p_i, filtered and normalized
    draft_probs: torch.Tensor | None,  # [k, V] q_i, or None for one-hot q (prompt lookup)
    generator: torch.Generator,
) -> list[int]:
    """The emitted tokens (accepted drafts, then a correction or the bonus token)."""
    k = len(drafts)
    if k == 0:
        return [outputs[0]]
    dev = target_probs.device
    d = torch.tensor(drafts, device=dev)  # [k]
    p_d = target_probs[:k].gather(1, d.unsqueeze(1)).squeeze(1)  # [k] p_i(d_i)
    q_d = torch.ones_like(p_d) if draft_probs is None else draft_probs.gather(1, d.unsqueeze(1)).squeeze(1)
    u = torch.rand(k, device=dev, generator=generator)  # [k]
    # accept while u_i < p_i(d_i) / q_i(d_i)  (u < ratio  <=>  u * q < p, no division by 0)
    accepted = (u * q_d < p_d).tolist()
    a = accepted.index(False) if False in accepted else k
    if a == k:
        return drafts + [outputs[k]]
    p = target_probs[a].float()  # [V]
    if draft_probs is None:
        residual = p.clone()
        residual[drafts[a]] = 0.0  # max(p - onehot(d_a), 0)
    else:
        residual = (p - draft_probs[a].float()).clamp_min(0.0)  # max(p - q, 0)
    if float(residual.sum()) <= 0.0:  # p == q up to rounding: a rejection there has mass 0
        residual = p
    # t ~ residual / sum(residual), by the exponential race argmax(r / E), E ~ Exp(1)
    noise = torch.empty_like(residual).exponential_(generator=generator)
    t = int((residual / noise).argmax())
    return drafts[:a] + [t]
