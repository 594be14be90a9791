"""Pick next tokens from logits: greedy rows in one argmax, sampled rows one by one.

Sampling: p = softmax(logits / T); keep the top_k most likely tokens, then the smallest set whose
mass reaches top_p; renormalize and draw. A request with a seed draws from its own generator,
so its tokens do not depend on what it is batched with.
"""

from __future__ import annotations

import torch

from ..engine.sampling_params import SamplingParams


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self._shared = torch.Generator().manual_seed(seed)
        self._per_seq: dict[int, torch.Generator] = {}

    def release(self, seq_id: int) -> None:
        self._per_seq.pop(seq_id, None)

    def _generator(self, seq_id: int, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self._shared
        gen = self._per_seq.get(seq_id)
        if gen is None:
            gen = self._per_seq[seq_id] = torch.Generator().manual_seed(params.seed)
        return gen

    def __call__(
        self, logits: torch.Tensor, seq_ids: list[int], params: list[SamplingParams]
    ) -> list[int]:
        # logits: [N, vocab] (fp32)
        tokens = logits.argmax(dim=-1).tolist()  # greedy for every row first
        for row, (seq_id, p) in enumerate(zip(seq_ids, params, strict=True)):
            if not p.is_greedy:
                tokens[row] = self._sample_row(logits[row], p, self._generator(seq_id, p))
        return tokens

    @staticmethod
    def _sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> int:
        scaled = logits.float().cpu() / p.temperature  # [vocab]
        if p.top_k > 0 and p.top_k < scaled.shape[0]:
            kth = torch.topk(scaled, p.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)  # [vocab]
        if p.top_p < 1.0:
            sorted_p, order = probs.sort(descending=True)  # [vocab]
            # drop a token when the mass before it already reaches top_p
            drop = (sorted_p.cumsum(0) - sorted_p) >= p.top_p
            sorted_p[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=gen).item())
