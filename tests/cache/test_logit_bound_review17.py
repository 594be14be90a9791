"""The reranker's logit range on damaged weights (review 17): a NaN in the head or the pooled
LayerNorm gives no range (every pair is scored), never a NaN range, which made the verifier skip
every pair (``sigmoid(NaN) >= at_least`` is False): a cache that never hit, silently.
Fast: a tiny synthetic cross-encoder (hidden size 8), built in memory."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm.cache import onnx_graph
from hybridllm.cache.logit_bound import graph_logit_range

N, VOCAB, SEQ = 8, 40, 12


def _model(damage: str | None) -> object:
    rng = np.random.default_rng(7)
    w = {
        "encoder.word.weight": rng.standard_normal((VOCAB, N)).astype(np.float32),
        "encoder.position.weight": np.zeros((SEQ, N), np.float32),
        "encoder.token_type.weight": np.zeros((2, N), np.float32),
        "encoder.emb_norm.weight": rng.standard_normal(N).astype(np.float32),
        "encoder.emb_norm.bias": rng.standard_normal(N).astype(np.float32),
        "head.weight": rng.standard_normal((1, N)).astype(np.float32),
        "head.bias": rng.standard_normal(1).astype(np.float32),
    }
    if damage is not None:
        w[damage].reshape(-1)[-1] = np.nan
    cfg = {"hidden_size": N, "num_attention_heads": 2, "num_hidden_layers": 0, "intermediate_size": 2 * N}
    return onnx_graph.cross_encoder(cfg, w)


def test_sound_weights_have_a_finite_range() -> None:
    low, high = graph_logit_range(_model(None))
    assert np.isfinite([low, high]).all() and low < high


@pytest.mark.parametrize(
    "damage", ["head.weight", "head.bias", "encoder.emb_norm.weight", "encoder.emb_norm.bias"]
)
def test_a_nan_weight_gives_no_range(damage: str) -> None:
    assert graph_logit_range(_model(damage)) is None
