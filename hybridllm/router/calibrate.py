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

__all__ = ["calibrate_logprob_threshold", "calibrate_threshold", "read_prompts"]


def calibrate_threshold(scores: ArrayLike, cloud_fraction: float) -> float:
    """The threshold that routes ``cloud_fraction`` of ``scores`` to the cloud."""
    if not 0.0 <= cloud_fraction <= 1.0:
        raise DataError(f"cloud_fraction must be between 0 and 1, got {cloud_fraction}.")
    s = np.sort(np.asarray(scores, dtype=np.float64).reshape(-1))
    if len(s) == 0:
        raise DataError("Calibration needs at least one prompt.")
    if not np.all(np.isfinite(s)):  # np.sort puts NaN last: the threshold would come out NaN
        raise DataError("Calibration got NaN or inf scores; check the router file.")
    n_cloud = int(round(cloud_fraction * len(s)))
    if n_cloud == 0:
        return float(min(1.0, np.nextafter(s[-1], np.inf)))
    if n_cloud >= len(s):
        return float(s[0])
    # midway between the last edge score and the first cloud score generalizes best
    return float((s[len(s) - n_cloud - 1] + s[len(s) - n_cloud]) / 2.0)


def calibrate_logprob_threshold(mean_logprobs: ArrayLike, correct: ArrayLike) -> float:
    """The cascade's escalation threshold from edge answers' confidence and correctness."""
    lp = np.asarray(mean_logprobs, dtype=np.float64)
    ok = np.asarray(correct, dtype=bool)
    keep = np.isfinite(lp)
    lp, ok = lp[keep], ok[keep]
    if len(lp) == 0 or ok.all() or (~ok).all():
        raise DataError(
            "Cascade calibration needs edge answers that are both right and wrong, each with "
            "its mean log-probability."
        )
    best_t, best = float(lp.min()), -1.0
    for t in np.unique(lp):
        escalate = lp < t
        balanced = (escalate[~ok].mean() + (~escalate[ok]).mean()) / 2.0
        if balanced > best:
            best_t, best = float(t), float(balanced)
    return best_t
