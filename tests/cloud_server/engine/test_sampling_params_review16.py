"""SamplingParams (review 16): inputs it took that later failed the request or were misread."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import InvalidRequestError
from cloud_server.layers.sampler import Sampler


def test_a_fraction_temperature_or_top_p_samples():
    # numbers.Real passed validation, then torch.tensor() could not take a Fraction: the request
    # was accepted and failed at its first token ("Could not infer dtype of Fraction")
    p = SamplingParams(temperature=Fraction(1, 2), top_p=Fraction(9, 10), seed=3)
    assert type(p.temperature) is float and type(p.top_p) is float
    assert (p.temperature, p.top_p) == (0.5, 0.9)
    out = Sampler()(torch.randn(2, 40), [1, 2], [p, SamplingParams()])
    assert all(isinstance(t, int) for t in out.tokens)


@pytest.mark.parametrize("value", ["false", "no", [], 2, 0.5])
def test_ignore_eos_must_be_a_truth_value(value):
    with pytest.raises(InvalidRequestError, match="ignore_eos") as e:  # "false" ignored EOS
        SamplingParams(ignore_eos=value)
    assert e.value.param == "ignore_eos"


def test_ignore_eos_truth_values():
    np = pytest.importorskip("numpy")
    for value, want in [(True, True), (False, False), (None, False), (1, True), (0, False),
                        (np.bool_(True), True)]:
        got = SamplingParams(ignore_eos=value).ignore_eos
        assert got is want
