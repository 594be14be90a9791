"""Carbon figures from out-of-range inputs: an intensity past float's range (a feed's or a fixed
one) and an infinite joules_per_token give a clear 'unknown' or ConfigError, never a traceback or
inf/NaN CO2 figures."""

from __future__ import annotations

import math

import pytest

from hybridllm._exceptions import ConfigError
from hybridllm.carbon import CarbonPlacer, CloudEndpoint


def test_a_feed_past_floats_range_is_unknown_not_a_failed_request():
    """Before: float(10**400) raised OverflowError out of intensity(), failing the request."""
    ep = CloudEndpoint("https://a.example/v1", carbon_intensity=lambda: 10**400)
    assert ep.intensity() is None
    ep.carbon_intensity = lambda: 120  # answers well again: the figure is used
    assert ep.intensity() == 120.0


def test_a_fixed_intensity_past_floats_range_is_a_config_error():
    with pytest.raises(ConfigError, match="carbon_intensity must be"):
        CloudEndpoint("https://a.example/v1", carbon_intensity=10**400)


@pytest.mark.parametrize("jpt", [math.inf, math.nan, 0, -1.0, "2"])
def test_joules_per_token_must_be_a_finite_positive_number(jpt):
    """Before: inf was accepted; each estimated request had energy_j inf, co2_g inf and, on the
    fastest endpoint itself, co2_saved_g = inf * 0 = NaN, which poisoned stats() sums; "2" raised
    a TypeError."""
    with pytest.raises(ConfigError, match="joules_per_token must be"):
        CarbonPlacer([], root=lambda u: u, joules_per_token=jpt)


def test_a_finite_joules_per_token_still_accounts():
    ep = CloudEndpoint("https://a.example/v1", carbon_intensity=360)
    placer = CarbonPlacer([ep], root=lambda u: u, joules_per_token=2.0)
    out = placer.account(ep.url, ep.url, None, None, 10)
    assert out["energy_j"] == 20.0 and out["energy_source"] == "estimate"
    assert out["co2_g"] == pytest.approx(20.0 / 3.6e6 * 360) and out["co2_saved_g"] == 0.0
