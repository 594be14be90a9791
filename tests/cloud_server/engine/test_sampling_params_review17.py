"""SamplingParams review 17: numpy's integers are integers.

``top_k=np.int64(50)`` (or a numpy seed, max_tokens, logprobs, stop id) was refused with
"top_k must be -1, 0 (off) or a positive integer" although numpy's floats passed; kept as a numpy
int, a seed would then raise OverflowError in the sampler's mod-2**64 arithmetic at the first draw.
"""

from __future__ import annotations

import pytest
import torch

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import InvalidRequestError
from cloud_server.layers.sampler import Sampler

np = pytest.importorskip("numpy")


def test_numpy_integers_pass_and_become_plain_ints():
    p = SamplingParams(
        top_k=np.int64(5), max_tokens=np.int32(4), seed=np.int64(7), logprobs=np.int64(2),
        num_speculative_tokens=np.int64(3), stop_token_ids=[np.int64(9)],
    )
    assert (p.top_k, p.max_tokens, p.seed, p.logprobs, p.num_speculative_tokens) == (5, 4, 7, 2, 3)
    assert p.stop_token_ids == [9]
    for v in (p.top_k, p.max_tokens, p.seed, p.logprobs, p.num_speculative_tokens, *p.stop_token_ids):
        assert type(v) is int


def test_a_numpy_seed_draws_as_its_int_in_both_streams():
    logits = torch.randn(1, 32, generator=torch.Generator().manual_seed(0))
    for stream in (0, 1):
        got = []
        for seed in (np.uint64(2**64 - 1), 2**64 - 1):
            s = Sampler()
            s.stream = stream
            got.append([s(logits, [1], [SamplingParams(seed=seed)]).tokens[0] for _ in range(4)])
        assert got[0] == got[1]


@pytest.mark.parametrize(
    ("field", "value"),
    [("top_k", np.int64(-2)), ("seed", np.float64(3.0)), ("max_tokens", np.int32(0)),
     ("logprobs", np.int64(21)), ("top_k", np.bool_(True)), ("stop_token_ids", [np.int64(-1)])],
)
def test_out_of_range_numpy_integers_still_name_their_field(field, value):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**{field: value})
    assert err.value.param == field
    assert field in str(err.value)
