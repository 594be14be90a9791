"""A repetition penalty near 0 (any r > 0 is valid, as in vLLM) on the engine (review 31).

The real-engine fuzzer sent ``repetition_penalty`` 2.4e-117: each seen positive logit divided by it
left float32's range (inf), the softmax made NaN of it, and the request ended with an error (a 500).
Penalised logits are now held within +-1e30, which is certain already and stays finite through any
temperature: the request is answered, and what r says (a seen token's logit made huge) holds.
"""

from __future__ import annotations

import pytest
import torch

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.layers.sampler import Sampler, TokenHistory

from .test_sampling_controls_review31 import PROMPT, _engine

TINY = 2.4185920439225036e-117


@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("spec", ["none", "ngram", "draft"])
def test_a_penalty_near_zero_is_answered(temperature: float, spec: str) -> None:
    eng = _engine(draft=spec == "draft")
    params = SamplingParams(temperature=temperature, max_tokens=12, ignore_eos=True, seed=3,
                            repetition_penalty=TINY, presence_penalty=-2.2e-16,
                            speculative_method=spec, num_speculative_tokens=3)
    eng.add_request("r", PROMPT, params)
    outs = []
    for _ in range(100):
        if not eng.has_unfinished():
            break
        outs += eng.step()
    assert not eng.has_unfinished()
    last = outs[-1]
    assert last.finished and last.finish_reason == "length", last.finish_reason
    assert sum(len(o.delta_token_ids) for o in outs) == 12


def test_the_penalised_logits_stay_finite_and_a_seen_token_wins() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 64, generator=g)
    ids = list(range(10))
    positive_seen = [[t for t in ids if logits[row, t] > 0] for row in (0, 1)]
    params = [SamplingParams(temperature=0.0, repetition_penalty=TINY),
              SamplingParams(temperature=0.3, repetition_penalty=TINY, seed=1)]
    hist = [TokenHistory(ids, 5, 10), TokenHistory(ids, 5, 10)]
    out = Sampler()._bias_and_penalise(logits, params, hist)
    assert torch.isfinite(out).all()
    assert all(positive_seen) and int(out[0].argmax()) in positive_seen[0]
    sampled = Sampler()(logits, [1, 2], params, histories=hist)
    assert all(isinstance(t, int) for t in sampled.tokens), sampled.tokens
    assert sampled.tokens[1] in positive_seen[1]
