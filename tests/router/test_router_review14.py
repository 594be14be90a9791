"""Review 14: a calibrated threshold where scores tie at the boundary. Before: the threshold was
the tied score itself, so every tied prompt went to the cloud (asked for 30% of ten prompts that
score alike, all ten went); two neighbouring floats' midpoint could round down onto the edge
score (asked for half of two prompts, both went). Now tied prompts go one way, the count nearer
the share asked for (the smaller where both are as near)."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm.router.router import calibrate_threshold, sends_to_cloud

from .fakes import length_router


def _share(scores: list[float], fraction: float) -> float:
    t = calibrate_threshold(scores, fraction)
    return float(np.mean(sends_to_cloud(np.asarray(scores), t)))


@pytest.mark.parametrize(("scores", "fraction", "share"), [
    ([0.5] * 10, 0.3, 0.0),  # all or none: none is nearer 30%
    ([0.5] * 10, 0.7, 1.0),  # all is nearer 70%
    ([0.1] * 5 + [0.5] * 4 + [0.9], 0.2, 0.1),  # 1 or 5 of 10 for 2: 1
    ([0.1] * 2 + [0.5] * 7 + [0.9], 0.5, 0.8),  # 1 or 8 of 10 for 5: 8
    ([0.1, 0.5, 0.5, 0.9], 0.5, 0.25),  # 1 or 3 of 4 for 2: as near, the smaller
    ([0.2, 1.0, 1.0, 1.0], 0.5, 0.75),  # 0 or 3 of 4 for 2: 3 (and the threshold stays below 1)
    ([0.1, 0.2, 0.3, 0.4], 0.5, 0.5),  # no tie: as before
])
def test_tied_scores_go_one_way_the_nearer_share(scores, fraction, share) -> None:
    assert _share(scores, fraction) == share


def test_neighbouring_floats_are_split() -> None:
    a = 0.5
    b = float(np.nextafter(a, 1.0))  # (a + b) / 2 rounds to a
    t = calibrate_threshold([a, b], 0.5)
    assert sends_to_cloud([a, b], t).tolist() == [False, True]


def test_calibrated_router_with_repeated_traffic_keeps_to_the_share() -> None:
    router = length_router(0.5)
    traffic = ["hello"] * 7 + [f"A longer question number {i}: " + "x" * 200 for i in range(3)]
    tuned = router.calibrated(traffic, 0.5)
    routes = [tuned.route(p)[0] for p in traffic]
    assert routes.count("cloud") == 3 and tuned.route("hello")[0] == "edge"
