"""Review 19: a NaN router score is an error, not a silent device route."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hybridllm._exceptions import RouterError
from hybridllm.router.policy import RoutingPolicy

from .fakes import length_router


def _nan_router(threshold: float = 0.0):
    # a scorer that scores NaN (a corrupt or custom one; a float32 overflow did it here until the
    # classifier redid overflowing logits in float64, see test_classifier_review20)
    r = length_router(threshold)

    class NaNScorer(type(r.scorer)):
        def predict(self, x, emb=None):
            return np.full(len(np.atleast_2d(x)), np.nan)

    fields = {f.name: getattr(r.scorer, f.name) for f in dataclasses.fields(r.scorer)}
    return dataclasses.replace(r, scorer=NaNScorer(**fields))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point
@pytest.mark.parametrize("band", [None, (0.2, 0.8)])
def test_nan_score_raises_instead_of_routing_to_the_device(band):
    router = _nan_router(threshold=0.0)  # every real score goes to the cloud
    assert np.isnan(router.score_text("Prove the Riemann hypothesis."))
    p = RoutingPolicy(router, privacy="off", cascade_band=band)
    with pytest.raises(RouterError, match="NaN"):
        p.decide("Prove the Riemann hypothesis.")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_forced_and_private_routes_do_not_score():
    p = RoutingPolicy(_nan_router(), privacy="keep_on_device")
    assert p.decide("Write a poem.", force="cloud").route == "cloud"
    assert p.decide("mail jane@example.com a poem").route == "edge"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_router_route_refuses_a_nan_score_too():
    """Router.route (used directly, not through the policy) sent a NaN score to the device."""
    with pytest.raises(RouterError, match="NaN"):
        _nan_router(threshold=0.0).route("Prove the Riemann hypothesis.")
