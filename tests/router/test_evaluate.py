"""RouteLLM metrics on cases small enough to check by hand (expected values worked out below)."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm._exceptions import DataError
from hybridllm.router.evaluate import quality_curve, random_baseline, router_metrics

# four prompts: weak right on the last two, strong right on the first three -> W = 0.5, S = 0.75
WEAK = [0, 0, 1, 1]
STRONG = [1, 1, 1, 0]  # gains (strong - weak): +1, +1, 0, -1


def test_oracle_order():
    # top-k in index order: quality 0.5, 0.75, 1.0, 1.0, 0.75 at k = 0..4
    m = router_metrics([3, 2, 1, 0], WEAK, STRONG)
    # area = 0.25 * (0.625 + 0.875 + 1.0 + 0.875) = 0.84375; APGR = (0.84375 - 0.5) / 0.25
    assert m["apgr"] == pytest.approx(1.375)
    assert m["cpt50"] == pytest.approx(0.25)  # 0.75 >= 0.625 at k = 1
    assert m["cpt80"] == pytest.approx(0.25)  # 0.75 >= 0.70
    assert m["calls_at_95"] == pytest.approx(0.25)  # 0.75 >= 0.7125
    assert m["n"] == 4


def test_worst_order():
    # reversed: quality 0.5, 0.25, 0.25, 0.5, 0.75; area = 0.25 * 1.625 = 0.40625
    m = router_metrics([0, 1, 2, 3], WEAK, STRONG)
    assert m["apgr"] == pytest.approx(-0.375)
    assert m["cpt50"] == pytest.approx(1.0)
    assert m["calls_at_95"] == pytest.approx(1.0)


def test_constant_score_is_the_random_diagonal():
    # ties are averaged over their order: q(x) = 0.5 + 0.25 x, area 0.625 -> APGR 0.5
    m = router_metrics([7, 7, 7, 7], WEAK, STRONG)
    assert m["apgr"] == pytest.approx(0.5)
    assert m["cpt50"] == pytest.approx(0.5)  # 0.5 + 0.0625 k >= 0.625 first at k = 2
    assert m["calls_at_95"] == pytest.approx(1.0)  # >= 0.7125 first at k = 4


def test_tie_groups_interpolate():
    c = quality_curve([1, 1, 0, 0], WEAK, STRONG)
    # groups {+1, +1} and {0, -1}: at k = 3 the expected gain is 2 - 0.5 = 1.5
    assert np.allclose(c.quality, [0.5, 0.75, 1.0, 0.875, 0.75])
    assert np.allclose(c.x, [0, 0.25, 0.5, 0.75, 1.0])


def test_random_baseline_is_near_half():
    rng = np.random.default_rng(1)
    weak = rng.random(4000) < 0.6
    strong = weak | (rng.random(4000) < 0.5)
    m = random_baseline(weak, strong)
    assert m["apgr"] == pytest.approx(0.5, abs=0.03)
    assert m["cpt50"] == pytest.approx(0.5, abs=0.05)


def test_strong_not_better_is_a_clear_error():
    with pytest.raises(DataError, match="not more accurate"):
        router_metrics([1, 2], [1, 1], [1, 0])


def test_mismatched_lengths():
    with pytest.raises(DataError):
        router_metrics([1, 2, 3], [1, 0], [1, 1])
