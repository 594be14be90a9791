"""Calibration on the user's own data.

Threshold: on the user's traffic, the score quantile that sends the wanted fraction to the cloud,

    threshold = quantile(scores, 1 - cloud_fraction)   =>   P(score >= threshold) ~ cloud_fraction

Cascade: the edge answer's mean token log-probability below ``t`` escalates to the cloud; ``t``
maximizes balanced accuracy (mean of the true-positive and true-negative rates) of "low confidence"
as a predictor of "the edge answer is wrong" on labelled answers.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from .._exceptions import DataError
from .dataset import read_prompts
from .router import calibrate_threshold  # runtime (Router.calibrated uses it); re-exported here

__all__ = ["calibrate_logprob_threshold", "calibrate_threshold", "read_prompts"]


def calibrate_logprob_threshold(mean_logprobs: ArrayLike, correct: ArrayLike) -> float:
    """The cascade's escalation threshold from edge answers' confidence and correctness."""
    lp = np.asarray(mean_logprobs, dtype=np.float64)
    right = np.asarray(correct)
    if lp.ndim != 1 or right.shape != lp.shape:
        raise DataError(
            f"Cascade calibration needs one correctness per mean log-probability: {lp.shape} "
            f"log-probabilities, {right.shape} correctness values."
        )
    # bool() of NaN, 0.7 or the text "no" is True: such an answer counted as right without a word
    if right.dtype.kind not in "biuf" or not np.all((right == 0) | (right == 1)):
        raise DataError("Cascade calibration needs each answer's correctness as 1 (right) or 0 (wrong).")
    ok = right.astype(bool)
    keep = np.isfinite(lp)
    lp, ok = lp[keep], ok[keep]
    if len(lp) == 0 or ok.all() or (~ok).all():
        raise DataError(
            "Cascade calibration needs edge answers that are both right and wrong, each with "
            "its mean log-probability."
        )
    # every distinct value t as the threshold at once (the loop over them, one pass over all answers
    # each, took a minute for 40,000 answers): the answers below t among the wrong and the right
    # ones, by binary search, each rate one division as a mean of booleans does, and the first
    # (lowest) t of the best balanced accuracy
    ts = np.unique(lp)
    wrong_below = np.searchsorted(np.sort(lp[~ok]), ts, side="left")
    right_below = np.searchsorted(np.sort(lp[ok]), ts, side="left")
    n_wrong, n_right = int((~ok).sum()), int(ok.sum())
    balanced = (wrong_below / n_wrong + (n_right - right_below) / n_right) / 2.0
    best = int(np.argmax(balanced))
    if best == 0:
        # t = the lowest value: "lp < t" holds for no answer, a floor that never escalates. It is
        # the pick only when no t beats chance (balanced accuracy 0.5): all log-probabilities
        # equal, or the wrong answers no less confident than the right ones
        same = f"all {len(lp)} are {ts[0]:g}" if len(ts) == 1 else (
            "the wrong answers are no less confident than the right ones")
        raise DataError(
            f"Cascade calibration: the edge answers' mean log-probabilities do not tell wrong "
            f"answers from right ones ({same}), so the floor would never escalate. Check that they "
            f"are each answer's own mean token log-probability (`hybridllm router label` writes "
            f"them), or leave them out to keep the default floor."
        )
    return float(ts[best])
