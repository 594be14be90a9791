"""Pick next tokens for a whole batch of rows at once, on the logits' device.

Sampling: p = softmax(logits / T); keep the top_k most likely tokens, then the smallest set whose
mass reaches top_p (the most likely token always stays); renormalize and draw. The draw is
argmax(p / E) with E ~ Exponential(1) per token, which picks token i with probability p_i
(the exponential race); a request with a seed draws its E from its own generator, so its tokens
do not depend on what it is batched with. Greedy rows are one argmax.

A failure that belongs to one row (its settings, its generator) ends that row only: the batch is
retried row by row and the failing rows come back as exceptions instead of tokens.

Log-probabilities, for the rows whose request asks for them only: log_softmax of the raw logits,
the model's own distribution before temperature, top-k and top-p (what OpenAI and vLLM report).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.sampling_params import SamplingParams


@dataclass
class SamplerOutput:
    tokens: list[int | BaseException]  # one per row: the token, or why the row failed
    probs: torch.Tensor | None = None  # [N, vocab] filtered distributions, when asked for
    logprobs: dict[int, torch.Tensor] | None = None  # row -> [vocab] raw log-probs, rows that ask


def raw_logprobs(logits: torch.Tensor, params: list[SamplingParams]) -> dict[int, torch.Tensor] | None:
    """log p = log_softmax(logits) of the rows whose request wants logprobs (None when none does)."""
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return None
    idx = torch.tensor(rows, device=logits.device)
    lp = torch.log_softmax(logits[idx].float(), dim=-1)  # [R, V], on the logits' device
    return {row: lp[j] for j, row in enumerate(rows)}


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self._seed = seed
        self._shared: dict[torch.device, torch.Generator] = {}
        self._per_seq: dict[int, torch.Generator] = {}

    def release(self, seq_id: int) -> None:
        self._per_seq.pop(seq_id, None)

    def generator(self, seq_id: int, params: SamplingParams, device: torch.device) -> torch.Generator:
        if params.seed is None:
            gen = self._shared.get(device)
            if gen is None:
                gen = self._shared[device] = torch.Generator(device).manual_seed(self._seed)
            return gen
        gen = self._per_seq.get(seq_id)
        if gen is None:
            gen = self._per_seq[seq_id] = torch.Generator(device).manual_seed(params.seed)
        return gen

    def __call__(
        self,
        logits: torch.Tensor,  # [N, vocab] fp32
        seq_ids: list[int],
        params: list[SamplingParams],
        *,
        return_probs: bool = False,
    ) -> SamplerOutput:
        logprobs = raw_logprobs(logits, params)
        try:
            tokens, probs = self._sample(logits, seq_ids, params, return_probs)
            return SamplerOutput(list(tokens), probs, logprobs)
        except Exception:  # find the rows at fault; the others still get their tokens
            out: list[int | BaseException] = []
            rows = []
            for i in range(logits.shape[0]):
                try:
                    tok, p = self._sample(
                        logits[i : i + 1], seq_ids[i : i + 1], params[i : i + 1], return_probs
                    )
                    out.append(tok[0])
                    rows.append(p)
                except Exception as exc:  # noqa: BLE001 - handed to that row's request
                    out.append(exc)
                    rows.append(None)
            probs = None
            if return_probs:
                probs = torch.cat([r if r is not None else torch.zeros_like(logits[:1]) for r in rows])
            return SamplerOutput(out, probs, logprobs)

    def _sample(
        self,
        logits: torch.Tensor,
        seq_ids: list[int],
        params: list[SamplingParams],
        return_probs: bool,
    ) -> tuple[list[int], torch.Tensor | None]:
        dev = logits.device
        greedy = logits.argmax(dim=-1)  # [N]
        sampled = [i for i, p in enumerate(params) if not p.is_greedy]
        if not sampled and not return_probs:
            return greedy.tolist(), None
        temps = torch.tensor([max(p.temperature, 1e-5) for p in params], device=dev)  # [N]
        scaled = logits.float() / temps.unsqueeze(1)  # [N, V]
        top_k = [p.top_k if 0 < p.top_k < logits.shape[1] else 0 for p in params]
        if any(top_k):
            k = torch.tensor([kk or logits.shape[1] for kk in top_k], device=dev)  # [N]
            kth = scaled.sort(dim=-1, descending=True).values.gather(1, (k - 1).unsqueeze(1))
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)  # [N, V]
        top_p = [p.top_p for p in params]
        if any(tp < 1.0 for tp in top_p):
            sorted_p, order = probs.sort(dim=-1, descending=True)  # [N, V]
            # drop a token when the mass before it already reaches top_p; keep the first always
            before = sorted_p.cumsum(dim=-1) - sorted_p
            drop = before >= torch.tensor(top_p, device=dev).unsqueeze(1)
            drop[:, 0] = False
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(1, order, sorted_p)
            probs = probs / probs.sum(dim=-1, keepdim=True)
        tokens = greedy.clone()
        if sampled:
            idx = torch.tensor(sampled, device=dev)
            chosen = probs[idx]  # [S, V]
            if not bool(torch.isfinite(chosen).all()):
                raise ValueError("the sampling settings give no valid distribution")
            noise = torch.empty_like(chosen)
            for row, i in enumerate(sampled):  # each row's own generator, before any token
                noise[row].exponential_(generator=self.generator(seq_ids[i], params[i], dev))
            tokens[idx] = (chosen / noise).argmax(dim=-1)
        return tokens.tolist(), (probs if return_probs else None)
