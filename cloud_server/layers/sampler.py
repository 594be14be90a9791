"""Pick next tokens for a whole batch of rows at once, on the logits' device.

Sampling: p = softmax(logits / T); keep the top_k most likely tokens, then the smallest set whose
mass reaches top_p (the most likely token always stays; of tied ones the lowest id first);
renormalize and draw. The draw is argmax(p / E) with E ~ Exponential(1) per token, which picks
token i with probability p_i (the exponential race); a request with a seed draws its E from its
own generator, so its tokens do not depend on what it is batched with. Greedy rows are one argmax.

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
        # which of a seeded request's streams this sampler draws: 0 the target's, 1 a draft
        # model's (``DraftProposer`` sets it on its runner's sampler)
        self.stream = 0

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
            # a draft model must not draw the target's numbers: the rejection rule needs its
            # drafts d ~ q apart from the target's draws, and with one stream the target's bonus
            # token and the next step's first draft read the same noise (the draft then repeats
            # the target's token far more often than q says, and the output is no longer p)
            # seed' = (seed + stream * 0x9E3779B9) mod 2^64: a CPU generator reads the low 32 bits
            seed = (params.seed + self.stream * 0x9E3779B9) % 2**64
            gen = self._per_seq[seq_id] = torch.Generator(device).manual_seed(seed)
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
        # argmax takes a NaN for the largest logit, so a row with one would emit the NaN's id, and
        # a row of -inf only (every token masked) would emit id 0: neither has a distribution, so
        # it fails instead (its request alone ends with an error); -1 marks it
        top = logits.gather(1, greedy.unsqueeze(1)).squeeze(1)  # [N]
        nan = top.isnan() | (top == float("-inf"))  # [N]
        greedy = greedy.masked_fill(nan, -1)
        sampled = [i for i, p in enumerate(params) if not p.is_greedy]
        if not sampled and not return_probs:
            return _no_nan(greedy.tolist()), None
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
            # stable: among tied tokens the lowest id comes first, so a cut through a tie keeps the
            # token greedy would pick (an unstable sort kept any of them: top_p 1e-9 gave id 66
            # where greedy gave 3), the same on every device and batch shape
            sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)  # [N, V]
            # drop a token when the mass before it already reaches top_p; keep the first always
            before = sorted_p.cumsum(dim=-1) - sorted_p
            # top_p = 1 is off: its rows get no threshold, since a float cumsum can reach 1 before
            # the tail (which a batch-mate's top_p < 1 would then cut from this row alone)
            limit = torch.tensor([tp if tp < 1.0 else float("inf") for tp in top_p], device=dev)
            drop = before >= limit.unsqueeze(1)
            drop[:, 0] = False
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            filtered = torch.zeros_like(probs).scatter_(1, order, sorted_p)
            # renormalize the filtered rows only: a top_p = 1 row stays bit for bit what it is alone
            cut = (limit < float("inf")).unsqueeze(1)  # [N, 1]
            probs = torch.where(cut, filtered / filtered.sum(dim=-1, keepdim=True), probs)
        tokens = greedy.clone()
        if sampled:
            idx = torch.tensor(sampled, device=dev)
            chosen = probs[idx]  # [S, V]
            # before any draw: a failed batch is sampled again row by row (a NaN row checked too)
            if not bool(torch.isfinite(chosen).all() & ~nan.any()):
                _no_nan(greedy.tolist())  # a NaN row says so
                # a +inf logit (an fp16 overflow) makes softmax inf / inf = NaN: the model's fault
                if bool(torch.isposinf(logits[idx]).any()):
                    raise ValueError("the model's logits hold an infinity (an overflow)")
                raise ValueError("the sampling settings give no valid distribution")
            noise = torch.empty_like(chosen)
            for row, i in enumerate(sampled):  # each row's own generator, before any token
                noise[row].exponential_(generator=self.generator(seq_ids[i], params[i], dev))
            tokens[idx] = (chosen / noise).argmax(dim=-1)
        return _no_nan(tokens.tolist()), (probs if return_probs else None)


def _no_nan(tokens: list[int]) -> list[int]:
    if -1 in tokens:  # a row whose logits hold a NaN or no finite value (see Sampler._sample)
        raise ValueError("the model's logits hold a NaN or no finite value")
    return tokens
