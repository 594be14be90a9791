"""The layers' numerics on tiny CPU tensors: RoPE scaling math and its bad factors, RMSNorm on
zero rows, GQA head mapping and the sliding window's edge (no model, no hub)."""

from __future__ import annotations

import math

import pytest
import torch

from cloud_server.exceptions import ModelLoadError
from cloud_server.layers.attention import AttentionMetadata, PrefillSpan, paged_attention
from cloud_server.layers.norm import RMSNorm
from cloud_server.layers.rope import RotaryEmbedding
from tests.cloud_server.models.test_loader_safetensors_review17 import CFG, _tensors

BAD_FACTORS = [
    {"rope_type": "linear", "factor": 0},  # inv_freq / 0: inf angles, NaN tables
    {"rope_type": "linear", "factor": float("nan")},
    {"rope_type": "linear", "factor": -2.0},  # finite, but the rotation runs backwards
    {"rope_type": "freq_factors", "factors": [1.0, 0.0]},  # a damaged GGUF rope_freqs
    {"rope_type": "llama3", "factor": 0, "original_max_position_embeddings": 8},
]


@pytest.mark.parametrize("scaling", BAD_FACTORS)
def test_a_factor_that_makes_garbage_tables_is_refused(scaling):
    with pytest.raises(ValueError, match="finite and positive"):
        RotaryEmbedding(4, 10000.0, 16, scaling=scaling)


@pytest.mark.parametrize("scaling", BAD_FACTORS[:2])
def test_the_loader_reports_it_as_a_model_load_error(scaling):
    from cloud_server.models.loader import build_model
    from cloud_server.models.loader_safetensors import config_from_hf

    config = config_from_hf({**CFG, "rope_scaling": scaling})
    with pytest.raises(ModelLoadError, match="finite and positive"):
        build_model(config, _tensors(), device=torch.device("cpu"), dtype=torch.float32, max_position=16)


def test_linear_and_llama3_scaling_follow_the_formulas():
    d, base = 16, 10000.0
    inv = [base ** (-2 * i / d) for i in range(d // 2)]  # theta_i = base^(-2i/d)
    # linear: theta_i / factor
    lin = RotaryEmbedding(d, base, 4, scaling={"type": "linear", "factor": 4.0}, dtype=torch.float64)
    assert torch.allclose(lin.cos[3], torch.tensor([math.cos(3 * t / 4) for t in inv], dtype=torch.float64))
    # llama3 (Llama 3.1 / HF _compute_llama3_parameters), with L = original length, wavelen = 2 pi / theta:
    #   wavelen < L / high  -> theta;  wavelen > L / low -> theta / factor;
    #   else s = (L / wavelen - low) / (high - low), theta' = (1 - s) theta / factor + s theta
    factor, old, low, high = 8.0, 64.0, 1.0, 4.0
    cfg = {"rope_type": "llama3", "factor": factor, "original_max_position_embeddings": old,
           "low_freq_factor": low, "high_freq_factor": high}
    want = []
    for t in inv:
        w = 2 * math.pi / t
        if w < old / high:
            want.append(t)
        elif w > old / low:
            want.append(t / factor)
        else:
            s = (old / w - low) / (high - low)
            want.append((1 - s) * t / factor + s * t)
    assert any(old / high <= 2 * math.pi / t <= old / low for t in inv)  # all three branches run
    rope = RotaryEmbedding(d, base, 8, scaling=cfg, dtype=torch.float64)
    assert torch.allclose(rope.cos[5], torch.tensor([math.cos(5 * t) for t in want], dtype=torch.float64))
    assert torch.allclose(rope.sin[5], torch.tensor([math.sin(5 * t) for t in want], dtype=torch.float64))


def test_rmsnorm_of_a_zero_row_is_zero_not_nan():
    norm = RMSNorm(8, 1e-6)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.zeros(2, 8, dtype=dtype)
        x[1] = 3.0
        y = norm(x)
        assert torch.equal(y[0].float(), torch.zeros(8))
        assert torch.allclose(y[1].float(), torch.ones(8), atol=1e-2)


def _prefill(q, k, v, window=None):
    """One prefill chunk of T tokens at positions 0..T-1 through paged_attention (one slot each)."""
    t, kvh, d = k.shape
    cache = torch.zeros(2, kvh, t, d)
    slots = torch.arange(t)
    meta = AttentionMetadata(slot_mapping=slots, prefills=[PrefillSpan(0, t, slots, 0)])
    return paged_attention(q, k, v, cache[0], cache[1], meta, scale=d**-0.5, window=window)


def _reference(q, k, v, window=None):
    """Eager attention with repeat_interleave GQA (HF repeat_kv: kv head j serves query heads
    j*g..j*g+g-1) and Gemma's window: key j is seen by query i when i - w < j <= i."""
    t, h, d = q.shape
    g = h // k.shape[1]
    kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)  # [T, H, D]
    s = torch.einsum("ihd,jhd->hij", q, kk) * d**-0.5
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    seen = (j <= i) & ((i - j < window) if window else True)
    return torch.einsum("hij,jhd->ihd", s.masked_fill(~seen, float("-inf")).softmax(-1), vv)


@pytest.mark.parametrize("window", [None, 1, 3])
def test_gqa_heads_and_window_edge_match_the_reference(window):
    torch.manual_seed(0)
    t, h, kvh, d = 7, 6, 2, 8
    q, k, v = torch.randn(t, h, d), torch.randn(t, kvh, d), torch.randn(t, kvh, d)
    out = _prefill(q, k, v, window)
    assert torch.allclose(out, _reference(q, k, v, window), atol=1e-5)
    if window == 1:  # each token sees itself only: its own v
        assert torch.allclose(out, v.repeat_interleave(h // kvh, dim=1), atol=1e-6)


@pytest.mark.parametrize("window", [None, 1, 3])
def test_a_decode_row_sees_the_same_window_as_prefill(window):
    torch.manual_seed(1)
    t, h, kvh, d = 7, 4, 1, 8
    q, k, v = torch.randn(t, h, d), torch.randn(t, kvh, d), torch.randn(t, kvh, d)
    cache = torch.zeros(2, kvh, t, d)
    cache[0, :, : t - 1], cache[1, :, : t - 1] = k[:-1].transpose(0, 1), v[:-1].transpose(0, 1)
    meta = AttentionMetadata(slot_mapping=torch.tensor([t - 1]), num_decode=1,
                             decode_gather=torch.arange(t)[None], decode_lens=torch.tensor([t]))
    out = paged_attention(q[-1:], k[-1:], v[-1:], cache[0], cache[1], meta, scale=d**-0.5, window=window)
    assert torch.allclose(out[0], _reference(q, k, v, window)[-1], atol=1e-5)


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_int8_rows_refuse_a_weight_that_is_not_finite(bad):
    from cloud_server.layers.linear import quantize_groups, quantize_rows

    w = torch.randn(4, 48)
    w[1, 5] = bad
    with pytest.raises(ValueError, match="not finite"):
        quantize_rows(w)  # was: scale inf/NaN, the row's codes garbage, NaN outputs at run time
    with pytest.raises(ValueError, match="not finite"):
        quantize_groups(w[:, :32])  # as the grouped format already did


def test_the_loader_names_the_tensor_with_the_bad_weight():
    from cloud_server.models.loader import convert_weights

    w = torch.randn(16, 48)  # 48 columns: not whole groups of 32, so one scale per row
    w[2, 7] = float("inf")
    with pytest.raises(ModelLoadError, match="down_proj.weight: weights not finite"):
        convert_weights({"model.layers.0.mlp.down_proj.weight": w}, quantization="int8",
                        dtype=torch.float32, device=torch.device("cpu"))


def test_int8_zero_rows_give_zero_outputs():
    from cloud_server.layers.linear import Linear, quantize_groups, quantize_rows

    w = torch.randn(32, 64)
    w[3] = 0  # a whole zero row: scale clamped, not 0/0
    w[5, :32] = 0  # a zero group
    for q, s in (quantize_rows(w), quantize_groups(w)):
        assert torch.isfinite(s.float()).all()
        layer = Linear(64, 32)
        layer.load(q, scale=s)
        for dtype in (torch.float32, torch.bfloat16):
            y = layer(torch.randn(3, 64).to(dtype)).float()
            assert torch.isfinite(y).all() and torch.equal(y[:, 3], torch.zeros(3))
    layer = Linear(64, 32)
    layer.load(torch.ones(32, 64, dtype=torch.int8), scale=torch.zeros(32))  # scales given as 0
    assert torch.equal(layer(torch.randn(2, 64)), torch.zeros(2, 32))
