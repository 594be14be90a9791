"""Cascade calibration on bad input, and at scale with the same numbers as the per-threshold loop."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hybridllm._exceptions import DataError
from hybridllm.router.calibrate import calibrate_logprob_threshold


def _loop(lp: np.ndarray, ok: np.ndarray) -> float:
    """The definition: each distinct value as t, the first of the best balanced accuracy."""
    best_t, best = float(lp.min()), -1.0
    for t in np.unique(lp):
        escalate = lp < t
        balanced = (escalate[~ok].mean() + (~escalate[ok]).mean()) / 2.0
        if balanced > best:
            best_t, best = float(t), float(balanced)
    return best_t


@pytest.mark.parametrize("seed", range(12))
def test_same_threshold_as_the_loop_bit_for_bit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    # rounded: many ties, as log-probabilities written with few decimals have
    lp = np.round(-rng.exponential(size=n), int(rng.integers(0, 4)))
    ok = rng.random(n) < np.exp(lp)
    ok[0], ok[-1] = True, False
    assert calibrate_logprob_threshold(lp, ok) == _loop(lp, ok)
    assert calibrate_logprob_threshold(lp, ok.astype(np.float64)) == _loop(lp, ok)


def test_many_answers_do_not_hang() -> None:
    # one pass over all answers per distinct value: a minute for 40,000 answers
    rng = np.random.default_rng(0)
    lp = -rng.exponential(size=60_000)
    ok = rng.random(len(lp)) < np.exp(lp)
    started = time.perf_counter()
    t = calibrate_logprob_threshold(lp, ok)
    assert time.perf_counter() - started < 30.0  # the old loop: about 2 minutes here
    assert lp.min() <= t <= lp.max()


@pytest.mark.parametrize("correct", [[1, np.nan, 0, 0], [0.7, 0.2, 0, 0], ["yes", "no", "no", "no"]])
def test_correctness_not_zero_or_one_is_refused(correct: list) -> None:
    # bool() made NaN, 0.7 and "no" right answers without a word
    with pytest.raises(DataError, match="1 \\(right\\) or 0 \\(wrong\\)"):
        calibrate_logprob_threshold([-0.1, -0.2, -3.0, -4.0], correct)


def test_lengths_that_differ_are_a_data_error() -> None:
    with pytest.raises(DataError, match="one correctness per mean log-probability"):
        calibrate_logprob_threshold([-1.0, -2.0, -3.0], [1, 0, 1, 0])


def test_all_nan_log_probabilities_are_a_data_error() -> None:
    with pytest.raises(DataError, match="both right and wrong"):
        calibrate_logprob_threshold([np.nan] * 4, [1, 0, 1, 0])


def test_constant_log_probabilities_never_escalate() -> None:
    # no information in them: the threshold would be their value, with nothing below it, a floor
    # that never escalates; refused (review18), it was returned without a word
    with pytest.raises(DataError, match="never escalate"):
        calibrate_logprob_threshold([-1.0] * 4, [1, 0, 1, 0])
