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
