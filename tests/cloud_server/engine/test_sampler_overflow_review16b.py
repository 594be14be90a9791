"""A sampled row whose logits hold +inf (an fp16 head that overflowed) has no distribution
(softmax gives inf / inf = NaN). It failed alone, but blamed the request's sampling settings,
which were fine; it names the model's logits now. Greedy rows keep their argmax."""

from __future__ import annotations

import pytest
import torch

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.layers.sampler import Sampler

INF = float("inf")


@pytest.mark.parametrize("return_probs", [False, True])
@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8),
                                    SamplingParams(temperature=0.8, top_k=2, top_p=0.9, seed=5)])
def test_a_plus_inf_row_fails_alone_naming_the_model(params, return_probs):
    logits = torch.tensor([[0.0, INF, 1.0, 0.5], [0.0, 3.0, 1.0, 0.5]])
    out = Sampler(seed=0)(logits, [1, 2], [params, SamplingParams(temperature=0.0)],
                          return_probs=return_probs)
    assert isinstance(out.tokens[0], ValueError), out.tokens
    assert "logits hold an infinity" in str(out.tokens[0])  # the old code: "the sampling settings"
    assert out.tokens[1] == 1  # the healthy row still gets its token


def test_a_greedy_plus_inf_row_keeps_its_argmax():
    logits = torch.tensor([[0.0, INF, 1.0, 0.5]])
    assert Sampler(seed=0)(logits, [1], [SamplingParams(temperature=0.0)]).tokens == [1]
