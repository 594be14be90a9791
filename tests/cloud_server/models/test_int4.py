"""Weight-only int4: a GGUF's own 4-bit groups, decoded exactly and multiplied by the engine's CPU
kernel (or torch's where it is not used).

The decoding (codes, scale, zero) must give back the GGUF's dequantized weights (bit for bit on the
real tensors, to fp32 rounding on random blocks); the
packed matmul must match x @ W^T of those fp32 weights up to the rounding of the activations (int8
per group of 32 in the engine's kernel, bf16 in torch's), the output, scale and zero; fused
layers are row concatenations; the weight cache returns the same codes.
The agreement with fp32 on real prompts is in ``test_int8.py``.
"""

from __future__ import annotations

import numpy as np
import pytest


def _random_blocks(type_name: str, nb: int, rng) -> np.ndarray:
    """Random raw blocks with finite fp16 scales (random bytes would hold NaNs and infinities)."""
    from cloud_server.models.dequant import _BLOCK_BYTES

    raw = rng.integers(0, 256, size=(nb, _BLOCK_BYTES[type_name]), dtype=np.uint8)
    heads = 2 if type_name == "Q4_0" else 4  # d (and m or dmin) at the start of the block
    halves = rng.uniform(-0.05, 0.05, size=(nb, heads // 2)).astype(np.float16)
    raw[:, :heads] = halves.view(np.uint8)
    return raw


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q4_K"])
def test_int4_groups_decode_exactly(type_name):
    import torch

    from cloud_server.layers.linear import int4_dequantize, pack_int4_codes
    from cloud_server.models.dequant import dequantize_fast_torch, int4_groups

    rng = np.random.default_rng(0)
    rows, cols = 32, 512
    per_row = cols // (256 if type_name == "Q4_K" else 32)
    raw = _random_blocks(type_name, rows * per_row, rng).reshape(rows, -1)
    q, scale, zero = int4_groups(raw, type_name)
    assert q.shape == (rows, cols) and scale.shape == zero.shape == (rows, cols // 32)
    assert int(q.max()) <= 15
    w = int4_dequantize(pack_int4_codes(q), torch.stack((scale, zero), dim=-1))
    ref = dequantize_fast_torch(raw, type_name)
    # the same weights up to fp32 rounding (Q4_K's zero = 8 d sc - dmin m is rounded once)
    torch.testing.assert_close(w, ref, rtol=1e-6, atol=1e-6 * float(ref.abs().max()))


def _real_int4(path, *tensor_names):
    """[(type name, codes two per byte, scale_zero fp32, the GGUF's dequantized fp32 weights)]."""
    import torch

    from cloud_server.layers.linear import pack_int4_codes
    from cloud_server.models.dequant import dequantize_fast_torch, int4_groups
    from cloud_server.models.loader_gguf import _read_raw, open_gguf

    _, gguf_file, _ = open_gguf(path)  # seconds for a large vocabulary: once per test
    infos = {t.name: t for t in gguf_file.tensors}
    out = []
    for name in tensor_names:
        info = infos[name]
        raw = _read_raw(str(path), info)
        q, scale, zero = int4_groups(raw, info.tensor_type.name)
        ref = dequantize_fast_torch(raw, info.tensor_type.name)
        out.append((info.tensor_type.name, pack_int4_codes(q), torch.stack((scale, zero), dim=-1), ref))
    return out


@pytest.mark.real
@pytest.mark.parametrize(
    ("model", "tensor", "type_name"),
    [("smollm2", "blk.0.ffn_down.weight", "Q4_1"), ("qwen05", "blk.11.ffn_down.weight", "Q4_K")],
)
def test_int4_matmul_matches_the_dequantized_weights(model, tensor, type_name, request):
    import torch

    from cloud_server.layers.linear import Linear, int4_dequantize

    ((kind, codes, scale_zero, ref),) = _real_int4(request.getfixturevalue(f"{model}_path"), tensor)
    assert kind == type_name
    assert torch.equal(int4_dequantize(codes, scale_zero), ref)  # exact before any rounding
    out_f, in_f = ref.shape
    layer = Linear(in_f, out_f)
    layer.load(codes, scale=scale_zero.to(torch.bfloat16))
    assert layer.int4 and layer.weight.dtype == torch.uint8
    x = torch.randn(5, in_f, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    y = layer(x).float()
    want = x.float() @ ref.T  # the GGUF's own weights in fp32
    # bf16 scale/zero (8-bit mantissa), a bf16 output and int8 activations: relative error 6e-3
    # (2^-8 with torch's kernel, bf16 activations)
    err = (y - want).norm() / want.norm()
    assert err < 1e-2, err
    cos = torch.nn.functional.cosine_similarity(y, want, dim=-1)
    assert cos.min() > 0.9999


@pytest.mark.real
def test_fused_rows_and_embedding_rows(smollm2_path):
    import torch

    from cloud_server.layers.linear import Embedding, Linear

    parts = _real_int4(smollm2_path, *(f"blk.2.attn_{p}.weight" for p in ("q", "k", "v")))
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    separate = []
    for _, codes, sz, ref in parts:
        one = Linear(576, ref.shape[0])
        one.load(codes, scale=sz.to(torch.bfloat16))
        separate.append(one(x))
    fused = Linear(576, sum(p[3].shape[0] for p in parts))
    fused.load(torch.cat([p[1] for p in parts]), scale=torch.cat([p[2] for p in parts]).to(torch.bfloat16))
    assert torch.equal(fused(x), torch.cat(separate, dim=-1))  # each row keeps its own groups

    _, codes, sz, ref = parts[0]  # as an embedding table: rows widened exactly
    emb = Embedding(ref.shape[0], 576)
    emb.load(codes, scale=sz)
    ids = torch.tensor([[0, 7], [575, 7]])
    assert torch.equal(emb(ids), ref[ids])


@pytest.mark.real
def test_int4_model_and_weight_cache(smollm2_path, tmp_path, monkeypatch):
    import torch

    from cloud_server.models import loader

    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path))
    monkeypatch.delenv("HYBRIDLLM_ENGINE_WEIGHT_CACHE", raising=False)

    def load():
        return loader.load_model(str(smollm2_path), device=torch.device("cpu"), dtype=torch.bfloat16,
                                 max_position=256, quantization="int4")

    def state(m):
        layer = m.model.layers[3]
        return [t.clone() for t in (layer.self_attn.qkv_proj.weight, layer.self_attn.qkv_proj.scale,
                                    layer.mlp.gate_up_proj.weight, m.lm_head.weight, m.lm_head.scale)
                if t is not None]  # the engine's int4 kernel keeps scales inside the weight

    first = load().model
    layer = first.model.layers[3]
    # the Q4_1 matrices are int4; the Q8_0 embedding (the tied head) falls back to int8 rows
    assert layer.self_attn.qkv_proj.int4 and layer.mlp.gate_up_proj.int4 and layer.self_attn.o_proj.int4
    # int8 (with its scales; in the engine kernel's format the codes are the bytes q + 128)
    assert not first.lm_head.int4 and first.lm_head.scale is not None
    (written,) = sorted((tmp_path / "engine-weights").glob("*.safetensors"))
    assert ".int4-bfloat16." in written.name

    def no_conversion(*a, **k):
        raise AssertionError("converted again although the cache holds the weights")

    monkeypatch.setattr(loader, "convert_weights", no_conversion)
    for a, b in zip(state(first), state(load().model), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_int4_verify_rows_come_in_blocks_of_four_with_torchs_kernel(torchs_kernels):
    # torch's int4 CPU kernel, like the int8 one, makes one pass over the weights per 4 rows
    # (measured: SmolLM2's head 1.7/2.6/2.7/3.0 ms for 1-4 rows, 4.7 ms for 5)
    import torch

    from cloud_server.layers.linear import int8_row_block

    assert int8_row_block(torch.device("cpu"), torch.bfloat16, "int4") == 4
