"""Review 28: calibration refuses scores outside [0, 1] (a custom scorer's). A threshold is a number
in [0, 1], so on scores of 0-10 the threshold came out clamped just below 1 and sent 90% of the
prompts where 30% was asked, without a word; on negative scores it came out below 0, which
Router.calibrated then refused as a bad threshold the caller never gave."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hybridllm import DataError
from hybridllm.router.calibrate import calibrate_threshold
from hybridllm.router.router import sends_to_cloud

from .fakes import length_router


@pytest.mark.parametrize("scores", [np.linspace(0.0, 10.0, 101), np.linspace(-1.0, 0.5, 101)])
def test_scores_outside_unit_range_are_refused(scores):
    with pytest.raises(DataError, match=r"scores in \[0, 1\], got scores from"):
        calibrate_threshold(scores, 0.3)


def test_scores_at_the_ends_of_the_range_still_calibrate():
    scores = np.linspace(0.0, 1.0, 101)
    t = calibrate_threshold(scores, 0.3)
    assert np.mean(sends_to_cloud(scores, t)) == pytest.approx(0.3, abs=0.01)


def test_router_with_a_scorer_beyond_one_refuses_to_calibrate():
    router = length_router(0.5)

    class TenfoldScorer(type(router.scorer)):
        def predict(self, x, emb=None):  # a custom scorer on a 0-10 scale
            return 10.0 * super().predict(x, emb)

    fields = {f.name: getattr(router.scorer, f.name) for f in dataclasses.fields(router.scorer)}
    custom = dataclasses.replace(router, scorer=TenfoldScorer(**fields))
    prompts = [f"question {i} " + "x" * (10 * i) for i in range(20)]
    with pytest.raises(DataError, match=r"scores in \[0, 1\]"):
        custom.calibrated(prompts, 0.3)
