"""Fast dequantization of the common GGUF block formats in torch (gguf's numpy code is the
fallback for the rest). Block layouts, 32 weights per block:

    Q8_0: f16 d, int8 q[32]              w = d * q
    Q4_0: f16 d, u8 nibbles[16]          w = d * (q - 8)
    Q4_1: f16 d, f16 m, u8 nibbles[16]   w = d * q + m
Nibbles: the low 4 bits of byte j are weight j, the high 4 bits weight j + 16.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}


def _f16(raw: torch.Tensor) -> torch.Tensor:  # [nb, 2] uint8 -> [nb, 1] fp32
    return raw.contiguous().view(torch.float16).float()


def _nibbles(raw: torch.Tensor) -> torch.Tensor:  # [nb, 16] uint8 -> [nb, 32] fp32
    return torch.cat((raw & 0x0F, raw >> 4), dim=1).float()


def dequantize_fast(data: np.ndarray, type_name: str) -> np.ndarray | None:
    """fp32 weights shaped [rows, cols] from a raw [rows, bytes] tensor, or None if unsupported."""
    size = _BLOCK_BYTES.get(type_name)
    if size is None:
        return None
    rows = data.shape[0] if data.ndim > 1 else 1
    with warnings.catch_warnings():  # the memory map is read-only; we only read it
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.from_numpy(np.ascontiguousarray(data)).reshape(-1, size)  # [nb, size]
    if type_name == "Q8_0":
        out = raw[:, 2:].contiguous().view(torch.int8).float() * _f16(raw[:, :2])
    elif type_name == "Q4_0":
        out = (_nibbles(raw[:, 2:]) - 8.0) * _f16(raw[:, :2])
    else:  # Q4_1
        out = _nibbles(raw[:, 4:]) * _f16(raw[:, :2]) + _f16(raw[:, 2:4])
    return out.reshape(rows, -1).numpy()  # [rows, cols]
