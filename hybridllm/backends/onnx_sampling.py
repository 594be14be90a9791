"""The next token from raw logits: repeat, presence and frequency penalties, top-k, top-p, min-p,
temperature, a seeded draw."""

from __future__ import annotations

from typing import Any

from .._exceptions import EdgeError
from .._types import GenerationParams

_PENALTY_WINDOW = 64  # llama.cpp's default repeat_last_n
_CANDIDATE_NATS = 30.0


def _sample(row: Any, params: GenerationParams, seed: int, step: int, recent: list[int],
            allowed: Any = None) -> int:
    """Pick the ``step``-th answer token from ``row`` ([vocab] raw logits); ``allowed`` ([vocab]
    bools, a response_format's mask): the only tokens that may be picked."""
    import numpy as np

    row = _finite(row)
    if allowed is not None:
        # first, as vLLM orders it: the refused tokens are out before the penalties, top-k,
        # top-p, min-p and temperature see the row (greedy: the best allowed token)
        row = np.where(allowed, row, -np.inf).astype(row.dtype, copy=False)
        if not np.isfinite(row.max()):
            raise EdgeError(
                "The model gave every token the response_format allows here a logit of -inf: no "
                "next token is possible.")
    penalty = float(getattr(params, "repeat_penalty", 1.0) or 1.0)
    if penalty != 1.0 and recent:
        # llama.cpp's rule: a seen token's positive logit is divided by the penalty, a negative one
        # multiplied, so both move towards "less likely"
        seen = np.unique(np.asarray(recent[-_PENALTY_WINDOW:]))
        row = row.copy()
        # a penalty near 0 (any > 0 is valid) divides past float32's range: inf, then NaN once
        # tempered, and the draw read the NaN. |logit| <= 1e30 is certain already and stays
        # finite through any temperature (the cloud engine caps the same)
        with np.errstate(over="ignore", divide="ignore"):
            penalised = np.where(row[seen] > 0, row[seen] / penalty, row[seen] * penalty)
        # (a token that cannot come, -inf, stays so: a response_format's mask)
        row[seen] = np.where(np.isneginf(row[seen]), row[seen], np.clip(penalised, -1e30, 1e30))
    presence = float(getattr(params, "presence_penalty", 0.0) or 0.0)
    frequency = float(getattr(params, "frequency_penalty", 0.0) or 0.0)
    if (presence or frequency) and recent:
        # OpenAI's rule (and the cloud engine's), over every answer token so far, not the prompt:
        #   logit[t] -= presence * [count[t] > 0] + frequency * count[t]
        # count[t]: how often t is in the answer; unseen tokens keep their logits
        seen, counts = np.unique(np.asarray(recent), return_counts=True)
        row = row.copy()
        row[seen] -= (presence + frequency * counts).astype(row.dtype)
    if params.temperature == 0.0:
        return int(row.argmax())  # the first of equal maxima: the lowest token id
    min_p = float(getattr(params, "min_p", 0.0) or 0.0)
    # candidates: tokens within 30 nats of the best at the larger of T and 1 (each one dropped has
    # p < e^-30 p_max under both softmaxes below), so a sort stays cheap on a 150k vocabulary
    peak = float(row.max())
    ids = np.flatnonzero(row >= peak - _CANDIDATE_NATS * max(params.temperature, 1.0))
    if 0 < params.top_k < ids.shape[0]:
        # the k-th largest logit; of the tokens tied with it, the lowest ids make up the k (before:
        # argpartition's pick among equal logits, whichever its partition left at the end)
        kth = np.partition(row[ids], ids.shape[0] - params.top_k)[ids.shape[0] - params.top_k]
        above, tied = ids[row[ids] > kth], ids[row[ids] == kth]  # ids ascend (flatnonzero)
        ids = np.concatenate([above, tied[: params.top_k - above.shape[0]]])
    # most likely first, equal logits in token id order (lowest first), so ties are cut and
    # summed the same way on every run: a draw then moves to another token only when the logits
    # really change, not when numerical noise shifts a cumulative sum taken in vocabulary order
    ids = ids[np.lexsort((ids, -row[ids]))]
    vals = row[ids].astype(np.float64)
    if params.top_p < 1.0 or min_p > 0.0:  # both judged on the untempered softmax, as llama.cpp does
        probs = np.exp(vals - vals[0])
        probs /= probs.sum()
        keep = ids.shape[0]
        if params.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), params.top_p) + 1)
        if min_p > 0.0:
            keep = min(keep, int((probs >= min_p * probs[0]).sum()))
        ids, vals = ids[: max(keep, 1)], vals[: max(keep, 1)]
    # p_i = softmax(logit_i / T) over the kept candidates, drawn by the Gumbel-max rule:
    #   pick = argmax_i(logit_i / T + g_i),  g_i = -log(-log u_i),  u_i ~ U(0, 1) i.i.d.
    # with u_i a hash of (seed, step, token id), so a seed repeats its answer even when the logits
    # differ in the last bits (a cache reused from another request, a chunked prefill)
    u = _uniform(ids, seed, step)
    return int(ids[np.argmax((vals - vals[0]) / params.temperature - np.log(-np.log(u)))])


def _uniform(ids: Any, seed: int, step: int) -> Any:
    """One U(0, 1) number per token id, fixed by (seed, step): splitmix64 over the ids."""
    import numpy as np

    mask = (1 << 64) - 1
    base = ((seed & mask) * 0x9E3779B97F4A7C15 + (step + 1) * 0xBF58476D1CE4E5B9) & mask
    with np.errstate(over="ignore"):
        x = ids.astype(np.uint64) * np.uint64(0x94D049BB133111EB) + np.uint64(base)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return ((x >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)  # in (0, 1)


def _finite(row: Any) -> Any:
    """``row`` with its non-finite logits given a defined meaning: -inf is a token that cannot come
    (kept), +inf a certain one (the +inf tokens alone remain, equally likely). A NaN anywhere, or no
    token left, is an :class:`EdgeError`: the model's numbers are broken, and before, a NaN row was
    a traceback from an empty argmax (or, greedy, silently the NaN's own token)."""
    import numpy as np

    if np.isfinite(row).all():
        return row
    if np.isnan(row).any():
        raise EdgeError(
            f"The model produced NaN logits ({int(np.isnan(row).sum())} of {row.shape[0]}): its "
            "weights or its graph are damaged; prepare it again or use another backend.")
    if np.isposinf(row).any():
        return np.where(np.isposinf(row), 0.0, -np.inf).astype(np.float32)
    if np.isneginf(row).all():
        raise EdgeError("The model gave every token a logit of -inf: no next token is possible.")
    return row
