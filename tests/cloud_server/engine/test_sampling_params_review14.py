"""SamplingParams: a wrong type is a clear InvalidRequestError, never a TypeError (review 14)."""

from __future__ import annotations

import pytest

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import InvalidRequestError


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", None),
        ("temperature", "0.7"),
        ("top_p", None),
        ("top_p", "1"),
        ("top_k", None),
        ("top_k", True),
        ("max_tokens", None),
        ("max_tokens", True),  # was one token
        ("max_tokens", "16"),
        ("seed", True),
        ("seed", "7"),
        ("stop", 5),
        ("stop_token_ids", 5),
        ("stop_token_ids", [True]),
        ("num_speculative_tokens", True),
    ],
)
def test_wrong_types_are_invalid_request_errors(field, value):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**{field: value})
    assert err.value.param == field


def test_null_stops_are_no_stops_and_tuples_become_lists():
    p = SamplingParams(stop=None, stop_token_ids=None)
    assert p.stop == [] and p.stop_token_ids == []
    p = SamplingParams(stop=("a", "b"), stop_token_ids=(3,))
    assert p.stop == ["a", "b"] and p.stop_token_ids == [3]


def test_numbers_of_other_types_still_pass():
    np = pytest.importorskip("numpy")
    p = SamplingParams(temperature=np.float32(0.5), top_p=np.float64(0.9), top_k=0, max_tokens=3)
    assert p.temperature == 0.5 and p.max_tokens == 3
    assert SamplingParams(temperature=0).is_greedy
