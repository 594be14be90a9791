"""Every block type the fast dequantizer reads, against gguf's own numpy dequantizer on random
blocks (random codes, finite random fp16 scales): the same numbers exactly, widened, as int4
groups and as int8 groups. (A check found no difference; kept as a guard.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cloud_server.models.dequant import (
    _BLOCK_BYTES,
    INT4_TYPES,
    INT8_GROUP_TYPES,
    dequantize_fast,
    int4_groups,
    int8_groups,
)


def _random_blocks(type_name: str, rows: int = 3, blocks_per_row: int = 4) -> np.ndarray:
    rng = np.random.default_rng(sum(map(ord, type_name)))
    size = _BLOCK_BYTES[type_name]
    raw = rng.integers(0, 256, size=(rows, blocks_per_row * size), dtype=np.uint8)
    blk = raw.reshape(-1, size)
    offsets = {"Q6_K": [208], "Q4_1": [0, 2], "Q4_K": [0, 2]}.get(type_name, [0])
    for off in offsets:  # the fp16 d (and m / dmin): finite, not random bits (NaN, inf)
        d = rng.uniform(-2, 2, size=blk.shape[0]).astype(np.float16)
        blk[:, off : off + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw


def _expand(groups: torch.Tensor) -> torch.Tensor:  # one value per 32 weights -> per weight
    return groups.float().repeat_interleave(32, dim=1)


@pytest.mark.parametrize("type_name", sorted(_BLOCK_BYTES))
def test_the_fast_dequantizer_matches_gguf(type_name):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = _random_blocks(type_name)
    ref = dequantize(raw, GGMLQuantizationType[type_name]).reshape(raw.shape[0], -1)
    np.testing.assert_array_equal(dequantize_fast(raw, type_name), ref)
    if type_name in INT4_TYPES:
        q, scale, zero = int4_groups(raw, type_name)
        w = _expand(scale) * (q.float() - 8) + _expand(zero)
        np.testing.assert_allclose(w.numpy(), ref, rtol=1e-6, atol=1e-6)
    if type_name in INT8_GROUP_TYPES:
        q, scale, zero = int8_groups(raw, type_name)
        w = _expand(scale) * q.float() + _expand(zero)
        np.testing.assert_allclose(w.numpy(), ref, rtol=1e-6, atol=1e-6)
