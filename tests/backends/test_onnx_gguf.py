"""The GGUF block decoders behind the int4 ONNX build: each format's blocks, read into
``scale * (q - zero_point) + offset``, give exactly the values gguf's own dequantizer gives."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from hybridllm.models.onnx_gguf import _pack, _stack, decode  # noqa: E402

# bytes per block, block size, byte offsets of the fp16 fields
FORMATS = {
    "Q4_0": (18, 32, (0,)),
    "Q4_1": (20, 32, (0, 2)),
    "Q5_0": (22, 32, (0,)),
    "Q8_0": (34, 32, (0,)),
    "Q4_K": (144, 256, (0, 2)),
    "Q6_K": (210, 256, (208,)),
}


def _random_blocks(name: str, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    size, block, halves = FORMATS[name]
    raw = rng.integers(0, 256, size=(rows, k // block, size), dtype=np.uint8)
    for at in halves:  # finite scales and minimums: random bytes could be NaN or inf
        raw[..., at : at + 2] = (
            rng.uniform(0.001, 0.05, (rows, k // block)).astype(np.float16)[..., None].view(np.uint8)
        )
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_decoded_blocks_are_the_gguf_values_exactly(name):
    rng = np.random.default_rng(0)
    rows, k = 6, 512
    raw = _random_blocks(name, rows, k, rng)
    blocks = decode(raw, name, rows, k)
    ref = np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]), np.float32)
    assert blocks.q.max() < (1 << blocks.bits) and blocks.zp.max() < (1 << blocks.bits)
    np.testing.assert_allclose(blocks.dequantize(), ref.reshape(rows, k), rtol=1e-6, atol=1e-7)


def test_fused_parts_share_the_widest_format_exactly():
    rng = np.random.default_rng(1)
    q4 = decode(_random_blocks("Q4_1", 4, 256, rng), "Q4_1", 4, 256)  # 4 bits, block 32, offsets
    q6 = decode(_random_blocks("Q6_K", 2, 256, rng), "Q6_K", 2, 256)  # 8 bits, block 16
    fused = _stack([q4, q6])
    assert (fused.bits, fused.block) == (8, 16)
    np.testing.assert_array_equal(fused.dequantize(), np.concatenate([q4.dequantize(), q6.dequantize()]))


def test_four_bit_packing_puts_the_first_value_in_the_low_nibble():
    q = np.array([[1, 2, 15, 0]], np.uint8)
    assert _pack(q, 4).tolist() == [[0x21, 0x0F]]
    assert _pack(q, 8).tolist() == q.tolist()
