"""Pick next tokens for a whole batch of rows at once, on the logits' device.

vLLM's and OpenAI's controls come first, in this order, on the rows that ask only (a batch where
none does takes the plain path, and a row that does not is bit for bit what it is alone):
1. ``logit_bias``: its bias is added to each listed token's logit.
2. ``repetition_penalty`` r (the CTRL rule, as vLLM and llama.cpp): for every token that appears in
   the prompt or the output so far, logit / r where the logit is > 0, logit * r otherwise.
3. ``presence_penalty`` p and ``frequency_penalty`` f (OpenAI's), over the output tokens so far:
   logit[t] -= p * [count[t] > 0] + f * count[t].
4. ``response_format`` (vLLM's grammar mask, which it applies with logit_bias, first): the tokens
   the row's grammar does not allow get -inf. Steps 1-3 act on each token's own logit, so their
   order against the mask changes nothing; it comes after them only so that the penalties' clamp
   to +-1e30 cannot lift a masked -inf back.
5. temperature, top_k, top_p (below), then ``min_p`` m: the tokens whose probability is below
   m * (the largest probability) are dropped, and the rest renormalized.
Greedy rows take the argmax of the biased, penalised and masked logits. "So far" is the row's own
position: a speculative step's row j counts the drafts before it (the output, if accepted).

Sampling: p = softmax(logits / T); keep the top_k most likely tokens, then the smallest set whose
mass reaches top_p (the most likely token always stays; of tied ones the lowest id first);
renormalize and draw. The draw is argmax(p / E) with E ~ Exponential(1) per token, which picks
token i with probability p_i (the exponential race); a request with a seed draws its E from its
own generator, so its tokens do not depend on what it is batched with. Greedy rows are one argmax.

A failure that belongs to one row (its settings, its generator) ends that row only: the batch is
retried row by row and the failing rows come back as exceptions instead of tokens.

Log-probabilities, for the rows whose request asks for them only: log_softmax of the raw logits,
the model's own distribution before bias, penalties, grammar mask, temperature, top-k, top-p and
min-p (what OpenAI and vLLM report).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..engine.sampling_params import SamplingParams
from ..exceptions import InvalidRequestError


class TokenHistory(NamedTuple):
    """What a row's penalties read: ``token_ids[:end]`` is its context (prompt, then output)."""

    token_ids: list[int]
    num_prompt_tokens: int
    end: int


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
        # a draft model's head may cover the first ids only: a bias on a later id is for a token
        # it never proposes, not a bad request (``DraftProposer`` sets it)
        self.partial_vocab = False

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
        histories: Sequence[TokenHistory | None] | None = None,  # per row; needed by penalties
        masks: Sequence[torch.Tensor | None] | None = None,  # per row: [V] bool, the grammar's tokens
    ) -> SamplerOutput:
        logprobs = raw_logprobs(logits, params)
        hist: list[TokenHistory | None] = list(histories) if histories is not None else [None] * len(params)
        mask: list[torch.Tensor | None] | None = list(masks) if masks is not None else None
        try:
            tokens, probs = self._sample(logits, seq_ids, params, return_probs, hist, mask)
            return SamplerOutput(list(tokens), probs, logprobs)
        except Exception:  # find the rows at fault; the others still get their tokens
            out: list[int | BaseException] = []
            rows = []
            for i in range(logits.shape[0]):
                try:
                    tok, p = self._sample(
                        logits[i : i + 1], seq_ids[i : i + 1], params[i : i + 1], return_probs,
                        hist[i : i + 1], mask[i : i + 1] if mask is not None else None,
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
        histories: list[TokenHistory | None],
        masks: list[torch.Tensor | None] | None = None,
    ) -> tuple[list[int], torch.Tensor | None]:
        dev = logits.device
        logits = self._bias_and_penalise(logits, params, histories)
        if masks is not None:
            logits = _grammar_mask(logits, masks)
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
        min_p = [p.min_p for p in params]
        if any(min_p):
            # drop t where p_t < m * max(p): top-k and top-p keep the most likely token and scale
            # the kept ones alike, so the ratio is the temperature distribution's; renormalize
            # the m > 0 rows only (the others stay bit for bit what they are alone)
            m = torch.tensor(min_p, device=dev).unsqueeze(1)  # [N, 1]
            kept = probs.masked_fill(probs < m * probs.amax(dim=-1, keepdim=True), 0.0)
            probs = torch.where(m > 0, kept / kept.sum(dim=-1, keepdim=True), probs)
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


    def _bias_and_penalise(
        self, logits: torch.Tensor, params: list[SamplingParams], histories: list[TokenHistory | None]
    ) -> torch.Tensor:
        """The logits with ``logit_bias`` and the penalties applied (the same tensor when no row
        asks): tensors are built for the rows that ask only."""
        biased = [i for i, p in enumerate(params) if p.logit_bias]
        penalised = [i for i, p in enumerate(params) if p.has_penalties]
        if not biased and not penalised:
            return logits
        dev, vocab = logits.device, logits.shape[1]
        logits = logits.float().clone()  # [N, V]: the raw logits stay the logprobs' source
        if biased:
            rows: list[int] = []
            ids: list[int] = []
            values: list[float] = []
            for i in biased:
                bias = params[i].logit_bias or {}
                if not self.partial_vocab and any(t >= vocab for t in bias):
                    raise InvalidRequestError(f"logit_bias holds a token id outside the vocabulary "
                                              f"(0..{vocab - 1})", param="logit_bias")
                for t, b in bias.items():
                    if t < vocab:
                        rows.append(i)
                        ids.append(t)
                        values.append(b)
            if rows:
                index = (torch.tensor(rows, device=dev), torch.tensor(ids, device=dev))
                logits.index_put_(index, torch.tensor(values, device=dev), accumulate=True)
        if penalised:
            self._penalise(logits, penalised, [params[i] for i in penalised],
                           [histories[i] for i in penalised])
        return logits

    @staticmethod
    def _penalise(
        logits: torch.Tensor, rows: list[int], params: list[SamplingParams],
        histories: list[TokenHistory | None],
    ) -> None:
        """Repetition, presence and frequency penalties of ``rows`` (their ``params`` and
        ``histories``), in place on ``logits`` [N, V]."""
        dev, vocab = logits.device, logits.shape[1]
        context_rows: list[torch.Tensor] = []
        output_rows: list[torch.Tensor] = []
        whole: dict[int, torch.Tensor] = {}  # one tensor per token list (a sequence's spec rows share it)
        for h in histories:
            if h is None:
                raise ValueError("penalties need the row's token history")
            ids = whole.get(id(h.token_ids))
            if ids is None:
                ids = whole[id(h.token_ids)] = _long_tensor(h.token_ids, dev)
            context_rows.append(ids[: h.end])
            output_rows.append(ids[h.num_prompt_tokens : h.end])
        # ids past a cut draft head are tokens it never proposes: not counted. Only the entries
        # of tokens a row has seen change, so the rules run on those (flat row * V + token
        # indices), not on every [N, V] entry: the cost follows the histories' length. A token
        # seen twice is written twice with the same value (both read the logit before the write)
        row_of = torch.tensor(rows, device=dev)  # [P]: penalised row p is logits' row row_of[p]
        seen, seen_p = _row_index(context_rows, row_of, vocab)  # [S], [S]
        out_index, out_p = _row_index(output_rows, row_of, vocab)
        emitted, where, counts = torch.unique(out_index, return_inverse=True, return_counts=True)  # [O]
        emitted_p = torch.empty_like(emitted).scatter_(0, where, out_p)  # [O]: each one's p
        r = torch.tensor([sp.repetition_penalty for sp in params], device=dev)  # [P]
        pres = torch.tensor([sp.presence_penalty for sp in params], device=dev)  # [P]
        freq = torch.tensor([sp.frequency_penalty for sp in params], device=dev)  # [P]
        flat = logits.view(-1)  # [N * V], a view: writes land in logits
        # CTRL: on tokens seen in prompt or output, a positive logit / r, a negative one * r
        #   logit[t] = logit[t] / r if logit[t] > 0 else logit[t] * r     (t seen, r != 1)
        # OpenAI: logit[t] -= p * [count[t] > 0] + f * count[t]           (output tokens only)
        row_r = r[seen_p]
        seen, row_r = seen[row_r != 1.0], row_r[row_r != 1.0]
        values = flat[seen]
        # a penalty near 0 (any r > 0 is valid) divided logits past float32's range: inf, then NaN
        # in the softmax, and the request failed (a 500). |logit| <= 1e30 is certain already
        # (softmax saturates far below) and keeps logit / T finite for every T >= 1e-5
        penalised = torch.where(values > 0, values / row_r, values * row_r)
        flat[seen] = penalised.clamp(-_LOGIT_CAP, _LOGIT_CAP)
        flat[emitted] = flat[emitted] - pres[emitted_p] - freq[emitted_p] * counts.to(logits.dtype)


_LOGIT_CAP = 1e30  # the largest magnitude a penalty may give a logit (see Sampler._penalise)


def _grammar_mask(logits: torch.Tensor, masks: list[torch.Tensor | None]) -> torch.Tensor:
    """``logits`` [N, V] with -inf where a row's grammar mask [V] is False (rows without a mask
    as they are): a new tensor, the raw logits stay the logprobs' source (and the per-row retry's)."""
    rows = [i for i, m in enumerate(masks) if m is not None]
    if not rows:
        return logits
    vocab = logits.shape[1]
    allowed = torch.stack([m[:vocab] for m in masks if m is not None])  # [S, V] bool
    out = logits.float().clone()  # [N, V]
    index = torch.tensor(rows, device=logits.device)  # [S]
    # logit[t] = -inf where the grammar refuses t; softmax then gives it 0, argmax never picks it
    # (only the S structured rows are written: a batch of plain rows beside one costs them nothing)
    out[index] = out[index].masked_fill(~allowed, float("-inf"))
    return out


def _long_tensor(ids: list[int], device: torch.device) -> torch.Tensor:
    """``torch.tensor(ids)``, 4x faster on a long list (through a machine-word array)."""
    if not ids:
        return torch.empty(0, dtype=torch.long, device=device)
    return torch.frombuffer(array("q", ids), dtype=torch.long).to(device)


def _row_index(rows: list[torch.Tensor], row_of: torch.Tensor,
               vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices row_of[p] * vocab + token of each list p's tokens below ``vocab``, and each
    one's p: two [sum of lengths] tensors."""
    dev = row_of.device
    if not rows:
        return torch.empty(0, dtype=torch.long, device=dev), torch.empty(0, dtype=torch.long, device=dev)
    owner = torch.repeat_interleave(torch.arange(len(rows), device=dev),
                                    torch.tensor([len(r) for r in rows], device=dev))
    ids = torch.cat(rows)
    inside = ids < vocab
    owner, ids = owner[inside], ids[inside]
    return row_of[owner] * vocab + ids, owner


def _no_nan(tokens: list[int]) -> list[int]:
    if -1 in tokens:  # a row whose logits hold a NaN or no finite value (see Sampler._sample)
        raise ValueError("the model's logits hold a NaN or no finite value")
    return tokens
