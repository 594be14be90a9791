"""Grouped int8 (groups of 32 along a row, a scale and a zero each): a GGUF's blocks read as such
groups give back its weights exactly; float weights round to within half a step; fused layers,
embedding rows and the loader keep every group as it was.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cloud_server.layers.linear import (  # noqa: E402
    Embedding,
    Linear,
    int8_groups_dequantize,
    quantize_groups,
    quantize_rows,
)
from cloud_server.models.dequant import dequantize_fast_torch, int8_groups  # noqa: E402


def _random_blocks(type_name: str, nb: int, rng) -> np.ndarray:
    """Random raw blocks with finite fp16 scales (random bytes would hold NaNs and infinities)."""
    from cloud_server.models.dequant import _BLOCK_BYTES

    raw = rng.integers(0, 256, size=(nb, _BLOCK_BYTES[type_name]), dtype=np.uint8)
    heads = 1 if type_name in ("Q4_0", "Q5_0", "Q8_0") else 2  # d (and m or dmin) lead the block
    raw[:, : 2 * heads] = rng.uniform(-0.05, 0.05, size=(nb, heads)).astype(np.float16).view(np.uint8)
    return raw


@pytest.mark.parametrize("type_name", ["Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q4_K"])
def test_gguf_blocks_are_int8_groups_exactly(type_name):
    rng = np.random.default_rng(1)
    rows, cols = 16, 512
    raw = _random_blocks(type_name, rows * cols // (256 if type_name == "Q4_K" else 32), rng)
    raw = raw.reshape(rows, -1)
    q, scale, zero = int8_groups(raw, type_name)
    assert q.dtype == torch.int8 and q.shape == (rows, cols)
    assert scale.shape == zero.shape == (rows, cols // 32)
    w = int8_groups_dequantize(q, torch.stack((scale, zero), dim=-1))
    ref = dequantize_fast_torch(raw, type_name)
    # the same weights up to fp32 rounding (Q4_K's zero is a product, rounded once)
    torch.testing.assert_close(w, ref, rtol=1e-6, atol=1e-6 * float(ref.abs().max()))
    if type_name != "Q4_K":  # every scale and zero is one of the block's own fp16 numbers
        sz = torch.stack((scale, zero), dim=-1)
        assert torch.equal(sz.to(torch.float16).float(), sz)


def test_float_weights_round_to_within_half_a_step():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(48, 96, generator=g) * torch.logspace(-3, 1, 48).unsqueeze(1)  # rows of any size
    w[5, 32:64] = 0.0  # an all-zero group
    q, sz = quantize_groups(w)
    assert q.dtype == torch.int8 and sz.dtype == torch.float16 and sz.shape == (48, 3, 2)
    assert int(q.abs().max()) <= 127 and not sz[..., 1].any()  # symmetric: zero 0
    back = int8_groups_dequantize(q, sz)
    step = sz[..., 0].float().repeat_interleave(32, dim=1)
    assert ((back - w).abs() <= step / 2 + 1e-7 * w.abs()).all()
    assert torch.equal(back[5, 32:64], torch.zeros(32))
    with pytest.raises(ValueError, match="fp16 group scales"):
        quantize_groups(torch.full((16, 32), 1e7))


def test_fused_rows_embedding_rows_and_heads_keep_their_groups():
    g = torch.Generator().manual_seed(3)
    parts = [quantize_groups(torch.randn(n, 64, generator=g)) for n in (32, 16, 16)]
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    separate = []
    for q, sz in parts:
        one = Linear(64, q.shape[0])
        one.load(q, scale=sz)
        separate.append(one(x))
    fused = Linear(64, 64)
    fused.load(torch.cat([p[0] for p in parts]), scale=torch.cat([p[1] for p in parts]))
    assert torch.equal(fused(x), torch.cat(separate, dim=-1))
    head = fused.first_rows(40)  # whole blocks of 16 rows where the kernels are, else 40
    assert torch.equal(head(x), fused(x)[:, : head.out_features])

    q, sz = parts[0]
    emb = Embedding(32, 64)
    emb.load(q, scale=sz)
    ids = torch.tensor([[0, 7], [31, 7]])
    assert torch.equal(emb(ids), int8_groups_dequantize(q, sz)[ids])
    tied = emb.as_linear()
    want = x.float() @ int8_groups_dequantize(q, sz).T
    assert ((tied(x).float() - want).norm() / want.norm()).item() < 2e-2
    assert torch.equal(emb(ids), int8_groups_dequantize(q, sz)[ids])  # the same rows after tying


def test_a_tied_int8_embedding_reads_its_rows_from_the_heads_blocks():
    """Where the int8 kernel repacks the tied head, the embedding gives up its own copy of the rows
    and reads them (exactly) from the head's blocks: one copy of the matrix, not two."""
    from cloud_server.layers.cpu_kernels import int8_mm

    if int8_mm() is None:
        pytest.skip("no engine int8 kernel on this CPU: the head keeps torch's layout")
    g = torch.Generator().manual_seed(5)
    q, sz = quantize_groups(torch.randn(96, 64, generator=g))
    emb = Embedding(96, 64)
    emb.load(q, scale=sz)
    head = emb.as_linear()
    assert head.blocks and emb.weight is None and emb.scale is None
    ids = torch.tensor([[0, 15, 16], [95, 40, 0]])
    assert torch.equal(emb(ids), int8_groups_dequantize(q, sz)[ids])
    rows = Embedding(96, 64)  # one fp32 scale per row: rounded to fp16 in the blocks, so kept apart
    rq, rs = quantize_rows(torch.randn(96, 64, generator=g))
    rows.load(rq, scale=rs)
    rows.as_linear()
    assert rows.weight is not None and torch.equal(rows(ids), rq[ids].float() * rs[ids].unsqueeze(-1))


@pytest.mark.real
def test_int8_loading_keeps_the_gguf_weights(smollm2_path):
    """SmolLM2's Q4_1 matrices and Q8_0 embedding come out of the converter as int8 groups equal to
    the GGUF's dequantized weights; a fused layer mixing int4 and int8 parts stays exact."""
    from cloud_server.models.loader import _int4_to_int8, convert_weights
    from cloud_server.models.loader_gguf import _read_raw, iter_gguf_tensors, open_gguf

    config, gguf_file, _ = open_gguf(smollm2_path)
    cpu = torch.device("cpu")
    weights = convert_weights(iter_gguf_tensors(gguf_file, config, quantization="int8"), device=cpu,
                              dtype=torch.bfloat16, quantization="int8")
    infos = {t.name: t for t in gguf_file.tensors}
    for gguf_name, name in (("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"),
                            ("token_embd.weight", "model.embed_tokens.weight")):
        info = infos[gguf_name]
        q, sz = weights[name]
        assert q.dtype == torch.int8 and sz.dtype == torch.float16
        ref = dequantize_fast_torch(_read_raw(str(smollm2_path), info), info.tensor_type.name)
        assert torch.equal(int8_groups_dequantize(q, sz), ref), gguf_name

    from cloud_server.layers.linear import int4_dequantize, pack_int4_codes
    from cloud_server.models.dequant import int4_groups

    info = infos["blk.0.ffn_down.weight"]
    c, s, z = int4_groups(_read_raw(str(smollm2_path), info), info.tensor_type.name)
    codes, sz4 = pack_int4_codes(c), torch.stack((s, z), dim=-1).to(torch.float16)
    q8, sz8 = _int4_to_int8((codes, sz4))
    assert torch.equal(int8_groups_dequantize(q8, sz8), int4_dequantize(codes, sz4))


def test_groups_kept_unpacked_are_widened_on_each_call():
    """Off the CPU (CUDA) int8 groups stay as loaded and are widened per call: the same branch,
    driven here on the CPU by placing the groups directly."""
    g = torch.Generator().manual_seed(4)
    q, sz = quantize_groups(torch.randn(24, 64, generator=g))
    layer = Linear(64, 24, bias=True)
    layer.weight, layer.scale, layer.bias = q, sz, torch.randn(24, generator=g)
    x = torch.randn(2, 5, 64, generator=g)
    want = x @ int8_groups_dequantize(q, sz).T + layer.bias
    torch.testing.assert_close(layer(x), want)
    torch.testing.assert_close(layer.first_rows(10)(x), layer(x)[..., :10])  # fp32 BLAS: not bitwise


def test_weights_too_large_for_groups_are_a_load_error_naming_the_tensor():
    from cloud_server.exceptions import ModelLoadError
    from cloud_server.models.loader import convert_weights

    huge = {"model.layers.0.mlp.down_proj.weight": torch.full((16, 32), 1e7)}
    with pytest.raises(ModelLoadError, match="down_proj.*quantization='none'"):
        convert_weights(huge, device=torch.device("cpu"), dtype=torch.bfloat16, quantization="int8")
