"""A repeat penalty near 0 on the ONNX backend's sampler (review 31; the cloud engine: see
tests/cloud_server/engine/test_tiny_repetition_penalty_review31.py).

Any penalty > 0 is valid; 2.4e-117 divided each seen positive logit past float32's range (inf),
tempering made NaN of it, and the draw returned the id of the first NaN (token 0, seen or not
likely) with numpy's RuntimeWarnings. Penalised logits are now held within +-1e30: the draw is
one of the seen tokens with a positive logit, as the rule means, and nothing warns.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from hybridllm import GenerationParams
from hybridllm.backends.onnx_sampling import _sample


@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0])
def test_a_penalty_near_zero_draws_a_seen_token_without_warnings(temperature: float) -> None:
    row = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    row[0] = -1.0  # token 0 seen but negative: the penalty makes it nearly 0, never the pick
    recent = list(range(10))
    positive_seen = {t for t in recent if row[t] > 0}
    params = GenerationParams(temperature=temperature, repeat_penalty=2.4e-117, top_k=0, top_p=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        picks = {_sample(row, params, seed, 0, recent) for seed in range(20)}
    assert positive_seen and picks <= positive_seen
