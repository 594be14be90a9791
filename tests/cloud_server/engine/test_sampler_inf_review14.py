"""A row whose logits are all -inf (every token masked) has no distribution: under greedy
decoding argmax gave token 0; it fails alone now, as a NaN row does."""

from __future__ import annotations

import pytest
import torch

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.layers.sampler import Sampler

NEG = float("-inf")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("return_probs", [False, True])
def test_an_all_minus_inf_row_fails_alone_and_never_emits_token_0(temperature, return_probs):
    logits = torch.tensor([[NEG, NEG, NEG, NEG], [0.0, 3.0, 1.0, 0.5]])
    params = [SamplingParams(temperature=temperature, seed=3), SamplingParams(temperature=0.0)]
    out = Sampler(seed=0)(logits, [1, 2], params, return_probs=return_probs)
    assert isinstance(out.tokens[0], ValueError), out.tokens  # the old code: token 0
    assert "no finite value" in str(out.tokens[0])
    assert out.tokens[1] == 1  # the healthy row still gets its token


def test_a_row_with_one_finite_logit_is_still_decoded():
    logits = torch.tensor([[NEG, NEG, 2.0, NEG]])
    out = Sampler(seed=0)(logits, [1], [SamplingParams(temperature=0.0)], return_probs=False)
    assert out.tokens == [2]
