"""Fast dequantization of the GGUF block formats in torch (gguf's numpy code is the fallback).

Block layouts (d, dmin: f16; "nibbles": the low 4 bits of byte j are weight j, the high 4 bits
weight j + 16 of a 32-weight block):

    Q8_0  34 B / 32 w: d, int8 q[32]                      w = d * q
    Q4_0  18 B / 32 w: d, nibbles[16]                     w = d * (q - 8)
    Q4_1  20 B / 32 w: d, m, nibbles[16]                  w = d * q + m
    Q5_0  22 B / 32 w: d, u32 qh, nibbles[16]             w = d * ((q | bit_j(qh) << 4) - 16)
    Q4_K 144 B / 256 w: d, dmin, 12 B of 6-bit (scale, min) for 8 sub-blocks of 32, 128 B q
                                                          w = d * sc * q - dmin * m
    Q6_K 210 B / 256 w: ql[128], qh[64], int8 sc[16], d   w = d * sc * (q6 - 32), 16 per scale

The 4-bit formats (Q4_0, Q4_1, Q4_K) are also read without widening (``int4_groups``): 4-bit
codes plus one (scale, zero) per 32 weights, w = scale * (q - 8) + zero, the form of torch's int4
CPU matmul. Those and Q5_0, Q8_0 are also read as int8 codes with one (scale, zero) per 32
weights, w = scale * q + zero (``int8_groups``), the engine's grouped int8.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

_BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q4_K": 144, "Q6_K": 210}


def _blocks(data: np.ndarray, type_name: str) -> tuple[torch.Tensor, int]:
    """A raw [rows, bytes] GGUF tensor -> (its blocks uint8 [nb, block bytes], rows)."""
    rows = data.shape[0] if data.ndim > 1 else 1
    size = _BLOCK_BYTES[type_name]
    if data.shape[-1] % size:  # a block across two rows would shift every later weight
        raise ValueError(f"a {type_name} row of {data.shape[-1]} bytes is not whole "
                         f"{size}-byte blocks")
    with warnings.catch_warnings():  # a read-only buffer is fine: it is only read
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.from_numpy(np.ascontiguousarray(data)).reshape(-1, size)
    return raw, rows


def _f16(raw: torch.Tensor) -> torch.Tensor:  # [nb, 2] uint8 -> [nb, 1] fp32
    return raw.contiguous().view(torch.float16).float()


def _nibbles(raw: torch.Tensor) -> torch.Tensor:  # [nb, 16] uint8 -> [nb, 32] uint8
    return torch.cat((raw & 0x0F, raw >> 4), dim=1)


def _q5_0_codes(raw: torch.Tensor) -> torch.Tensor:  # [nb, 22] -> [nb, 32] uint8 in 0..31
    shifts = torch.arange(8, dtype=torch.uint8)
    bits = ((raw[:, 2:6].unsqueeze(2) >> shifts) & 1).reshape(-1, 32)  # bit j of the u32 qh
    return _nibbles(raw[:, 6:]) | (bits << 4)


def _q5_0(raw: torch.Tensor) -> torch.Tensor:  # [nb, 22] -> [nb, 32]
    return (_q5_0_codes(raw).float() - 16.0) * _f16(raw[:, :2])


def _k_scales(sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's 12 bytes -> (scales, mins) [nb, 8] (llama.cpp's get_scale_min_k4)."""
    sc = sc.to(torch.int64)
    lo_s, lo_m = sc[:, 0:4] & 63, sc[:, 4:8] & 63  # sub-blocks 0..3
    hi_s = (sc[:, 8:12] & 0x0F) | ((sc[:, 0:4] >> 6) << 4)  # sub-blocks 4..7
    hi_m = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return torch.cat((lo_s, hi_s), 1).float(), torch.cat((lo_m, hi_m), 1).float()


def _q4_k(raw: torch.Tensor) -> torch.Tensor:  # [nb, 144] -> [nb, 256]
    d, dmin = _f16(raw[:, 0:2]), _f16(raw[:, 2:4])  # [nb, 1]
    scales, mins = _k_scales(raw[:, 4:16])  # [nb, 8]
    qs = raw[:, 16:].reshape(-1, 4, 32)  # 4 chunks of 64 weights: low nibbles, then high
    q = torch.stack((qs & 0x0F, qs >> 4), dim=2).reshape(-1, 8, 32).float()  # [nb, 8, 32]
    w = (d * scales).unsqueeze(2) * q - (dmin * mins).unsqueeze(2)
    return w.reshape(-1, 256)


def _q6_k(raw: torch.Tensor) -> torch.Tensor:  # [nb, 210] -> [nb, 256]
    ql = raw[:, :128].reshape(-1, 2, 64)  # two halves of 128 weights
    qh = raw[:, 128:192].reshape(-1, 2, 32)
    sc = raw[:, 192:208].contiguous().view(torch.int8).float().reshape(-1, 2, 8)
    d = _f16(raw[:, 208:210]).unsqueeze(2)  # [nb, 1, 1]
    lo = torch.cat((ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4),
                   dim=2)  # [nb, 2, 128]: quarters l, l+32, l+64, l+96
    hi = torch.cat(((qh >> 0) & 3, (qh >> 2) & 3, (qh >> 4) & 3, (qh >> 6) & 3), dim=2)
    q = (lo | (hi << 4)).float() - 32.0  # [nb, 2, 128] in -32..31
    scale = (d * sc).repeat_interleave(16, dim=2)  # [nb, 2, 128]: one scale per 16 weights
    return (scale * q).reshape(-1, 256)


INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")  # 4-bit codes with one scale and offset per 32 weights


def _four_bit(data: np.ndarray, type_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A raw 4-bit tensor -> (codes uint8 [rows, cols] in 0..15, scale, zero fp32 [rows, cols / 32])
    with w = scale * q + zero: Q4_0 (d, -8 d), Q4_1 (d, m), Q4_K sub-block j (d sc_j, -dmin m_j)."""
    if type_name not in INT4_TYPES:
        raise ValueError(f"{type_name} is not a 4-bit GGUF type {INT4_TYPES}")
    raw, rows = _blocks(data, type_name)
    if type_name == "Q4_K":
        d, dmin = _f16(raw[:, 0:2]), _f16(raw[:, 2:4])  # [nb, 1]
        sc, mn = _k_scales(raw[:, 4:16])  # [nb, 8]
        qs = raw[:, 16:].reshape(-1, 4, 32)
        q = torch.stack((qs & 0x0F, qs >> 4), dim=2).reshape(-1, 8, 32)  # [nb, 8 sub-blocks, 32]
        scale, zero = d * sc, -(dmin * mn)  # [nb, 8]
    else:
        off = 2 if type_name == "Q4_0" else 4
        q = _nibbles(raw[:, off:])  # [nb, 32]
        scale = _f16(raw[:, :2])  # [nb, 1]
        zero = -8.0 * scale if type_name == "Q4_0" else _f16(raw[:, 2:4])
    return q.reshape(rows, -1), scale.reshape(rows, -1), zero.reshape(rows, -1)


def int4_groups(data: np.ndarray, type_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A raw [rows, bytes] 4-bit GGUF tensor -> (codes uint8 [rows, cols] in 0..15, scale fp32
    [rows, cols / 32], zero fp32 [rows, cols / 32]) with w = scale * (q - 8) + zero, exactly.

    Q4_0: w = d (q - 8): scale d, zero 0.  Q4_1: w = d q + m: scale d, zero m + 8 d.
    Q4_K sub-block j: w = d sc_j q - dmin m_j: scale d sc_j, zero 8 d sc_j - dmin m_j.
    """
    q, scale, zero = _four_bit(data, type_name)
    return q, scale, zero + 8.0 * scale


def dequantize_fast_torch(data: np.ndarray, type_name: str) -> torch.Tensor | None:
    """fp32 weights [rows, cols] from a raw [rows, bytes] GGUF tensor, or None if unsupported."""
    size = _BLOCK_BYTES.get(type_name)
    if size is None:
        return None
    raw, rows = _blocks(data, type_name)  # [nb, size]
    if type_name == "Q8_0":
        out = raw[:, 2:].contiguous().view(torch.int8).float() * _f16(raw[:, :2])
    elif type_name == "Q4_0":
        out = (_nibbles(raw[:, 2:]).float() - 8.0) * _f16(raw[:, :2])
    elif type_name == "Q4_1":
        out = _nibbles(raw[:, 4:]).float() * _f16(raw[:, :2]) + _f16(raw[:, 2:4])
    elif type_name == "Q5_0":
        out = _q5_0(raw)
    elif type_name == "Q4_K":
        out = _q4_k(raw)
    else:  # Q6_K
        out = _q6_k(raw)
    return out.reshape(rows, -1)  # [rows, cols]


def dequantize_fast(data: np.ndarray, type_name: str) -> np.ndarray | None:
    """numpy face of ``dequantize_fast_torch`` (fp32 [rows, cols] or None)."""
    out = dequantize_fast_torch(data, type_name)
    return None if out is None else out.numpy()


INT8_GROUP_TYPES = ("Q8_0", "Q5_0", *INT4_TYPES)  # integer codes with one scale and offset per 32 weights


def int8_groups(data: np.ndarray, type_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A raw [rows, bytes] GGUF tensor of a type in ``INT8_GROUP_TYPES`` -> (codes int8 [rows, cols],
    scale fp32 [rows, cols / 32], zero fp32 [rows, cols / 32]) with w = scale * q + zero, exactly.

    Q8_0: scale d, zero 0.  Q5_0: codes q - 16, scale d, zero 0.  Q4_0: codes q - 8, scale d,
    zero 0.  Q4_1: scale d, zero m.  Q4_K sub-block j: scale d sc_j, zero -dmin m_j. Every scale
    and zero is then one of the block's fp16 numbers, except Q4_K's products.
    """
    if type_name in INT4_TYPES:
        q, scale, zero = _four_bit(data, type_name)
        if type_name == "Q4_0":
            return q.to(torch.int8) - 8, scale, torch.zeros_like(scale)
        return q.to(torch.int8), scale, zero
    if type_name not in INT8_GROUP_TYPES:
        raise ValueError(f"{type_name} is not one of {INT8_GROUP_TYPES}")
    raw, rows = _blocks(data, type_name)
    scale = _f16(raw[:, :2])  # [nb, 1]
    if type_name == "Q8_0":
        q = raw[:, 2:].contiguous().view(torch.int8)
    else:  # Q5_0
        q = _q5_0_codes(raw).to(torch.int8) - 16
    return q.reshape(rows, -1), scale.reshape(rows, -1), torch.zeros_like(scale).reshape(rows, -1)
