"""A GGUF tensor's quantized blocks read as ``scale * (q - zp) + offset``, without rounding (build time)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Blocks:
    """A weight [rows, K] as ``scale * (q - zp) + offset`` per block along K."""

    q: np.ndarray  # uint8 [rows, K], values < 2**bits
    scale: np.ndarray  # float32 [rows, K // block]
    zp: np.ndarray  # uint8 [rows, K // block]
    offset: np.ndarray | None  # float32 [rows, K // block], None when all zero
    bits: int
    block: int

    def dequantize(self) -> np.ndarray:
        rows, k = self.q.shape
        nb = k // self.block
        w = (self.q.reshape(rows, nb, self.block).astype(np.float32) - self.zp[..., None]) * self.scale[
            ..., None
        ]
        if self.offset is not None:
            w += self.offset[..., None]
        return w.reshape(rows, k)

    def widen(self, bits: int, block: int) -> Blocks:
        """The same weights with ``bits`` and a block that divides this one's (exact)."""
        rep = self.block // block
        off = None if self.offset is None else np.repeat(self.offset, rep, axis=1)
        return Blocks(
            self.q, np.repeat(self.scale, rep, axis=1), np.repeat(self.zp, rep, axis=1), off, bits, block
        )


def _f16(raw: np.ndarray, at: int) -> np.ndarray:
    """[rows, blocks] float32 from the fp16 at byte ``at`` of each block."""
    return raw[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _nibbles_32(qs: np.ndarray) -> np.ndarray:
    """ggml's 32-value nibble layout: byte j holds value j (low) and value j + 16 (high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _affine(q: np.ndarray, scale: np.ndarray, minimum: np.ndarray, bits: int, block: int) -> Blocks:
    """w = scale * q + minimum -> an integer zero point and the exact rest as an offset."""
    safe = np.where(scale == 0, 1.0, scale)
    zp = np.clip(np.round(-minimum / safe), 0, (1 << bits) - 1)
    offset = (minimum + scale * zp).astype(np.float32)
    return Blocks(q, scale, zp.astype(np.uint8), offset if np.any(offset) else None, bits, block)


def _k_scale_min(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes -> 8 six-bit scales and mins ([.., 8] each)."""
    d = sc.astype(np.uint16)
    scales = np.empty(sc.shape[:-1] + (8,), np.uint16)
    mins = np.empty_like(scales)
    scales[..., :4] = d[..., 0:4] & 63
    mins[..., :4] = d[..., 4:8] & 63
    scales[..., 4:] = (d[..., 8:12] & 0x0F) | ((d[..., 0:4] >> 6) << 4)
    mins[..., 4:] = (d[..., 8:12] >> 4) | ((d[..., 4:8] >> 6) << 4)
    return scales.astype(np.float32), mins.astype(np.float32)


def decode(raw: np.ndarray, type_name: str, rows: int, k: int) -> Blocks:
    """A GGUF tensor's raw bytes ([rows, row bytes] uint8) -> :class:`Blocks`, no rounding."""
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)
    if type_name == "Q4_0":  # 18 bytes: d, 16 bytes of nibbles
        b = raw.reshape(rows, k // 32, 18)
        q = _nibbles_32(b[..., 2:]).reshape(rows, k)
        return Blocks(q, _f16(b, 0), np.full((rows, k // 32), 8, np.uint8), None, 4, 32)
    if type_name == "Q4_1":  # 20 bytes: d, m, 16 bytes of nibbles
        b = raw.reshape(rows, k // 32, 20)
        q = _nibbles_32(b[..., 4:]).reshape(rows, k)
        return _affine(q, _f16(b, 0), _f16(b, 2), 4, 32)
    if type_name == "Q5_0":  # 22 bytes: d, 32 high bits, 16 bytes of nibbles
        b = raw.reshape(rows, k // 32, 22)
        high = b[..., 2:6].copy().view(np.uint32)[..., 0]  # [rows, blocks]
        bits5 = ((high[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        q = (_nibbles_32(b[..., 6:]) | (bits5 << 4)).reshape(rows, k)
        return Blocks(q, _f16(b, 0), np.full((rows, k // 32), 16, np.uint8), None, 8, 32)
    if type_name == "Q8_0":  # 34 bytes: d, 32 int8
        b = raw.reshape(rows, k // 32, 34)
        q = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8).reshape(rows, k)
        return Blocks(q, _f16(b, 0), np.full((rows, k // 32), 128, np.uint8), None, 8, 32)
    if type_name == "Q4_K":  # 144 bytes per 256: d, dmin, 12 bytes of 6-bit scales/mins, 128 of nibbles
        b = raw.reshape(rows, k // 256, 144)
        d, dmin = _f16(b, 0)[..., None], _f16(b, 2)[..., None]
        sc, mn = _k_scale_min(b[..., 4:16])
        qs = b[..., 16:].reshape(rows, k // 256, 4, 32)  # 4 chunks of 64 values: low nibbles, then high
        q = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(rows, k)
        return _affine(q, (d * sc).reshape(rows, -1), (-dmin * mn).reshape(rows, -1), 4, 32)
    if type_name == "Q6_K":  # 210 bytes per 256: 128 low nibbles, 64 of 2 high bits, 16 int8 scales, d
        b = raw.reshape(rows, k // 256, 210)
        ql = b[..., :128].reshape(rows, -1, 2, 64)  # two halves of 128 values
        qh = b[..., 128:192].reshape(rows, -1, 2, 32)
        lo = np.stack(
            [ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=3
        )
        hi = np.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=3)
        q = (lo | (hi << 4)).reshape(rows, k)  # per half: 4 runs of 32 values
        sc = b[..., 192:208].view(np.int8).astype(np.float32)  # one per 16 values, in order
        scale = (_f16(b, 208)[..., None] * sc).reshape(rows, -1)
        return Blocks(q, scale, np.full((rows, k // 16), 32, np.uint8), None, 8, 16)
    raise NotImplementedError(type_name)


def rtn8(w: np.ndarray, block: int = 32) -> Blocks:
    """8-bit round-to-nearest with a zero point, for tensors the GGUF keeps in F16/F32."""
    rows, k = w.shape
    b = w.reshape(rows, k // block, block).astype(np.float32)
    lo, hi = np.minimum(b.min(-1), 0), np.maximum(b.max(-1), 0)
    scale = np.where(hi > lo, (hi - lo) / 255, 1.0).astype(np.float32)
    zp = np.clip(np.round(-lo / scale), 0, 255)
    q = np.clip(np.round(b / scale[..., None]) + zp[..., None], 0, 255).astype(np.uint8).reshape(rows, k)
    return Blocks(q, scale, zp.astype(np.uint8), None, 8, block)


def gguf_blocks(gguf_path: Path) -> tuple[dict[str, Any], Any]:
    """GGUF tensors by name, and a function ``name -> Blocks`` (HF row order: q/k unpermuted).

    The header alone is read (the vocabulary skipped), and each tensor's bytes when it is loaded.
    """
    from cloud_server.models.loader_gguf import _read_raw, read_gguf, unpermute_qk

    meta, _, infos = read_gguf(gguf_path)
    tensors = {t.name: t for t in infos}
    arch = str(meta["general.architecture"])
    heads = int(meta[f"{arch}.attention.head_count"])
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))

    def load(name: str) -> Blocks:
        t = tensors[name]
        rows = int(t.shape[0])  # numpy shape: [rows, K] ([rows, row bytes] for block formats)
        k = t.n_elements // rows
        raw = _read_raw(str(gguf_path), t)
        try:
            blocks = decode(raw, t.tensor_type.name, rows, k)
        except NotImplementedError:
            from gguf.quants import dequantize

            blocks = rtn8(np.asarray(dequantize(raw, t.tensor_type), np.float32).reshape(rows, k))
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            # llama.cpp permutes q/k rows; whole rows move, so the blocks along K are untouched
            n = heads if "attn_q" in name else kv_heads
            order = unpermute_qk(np.arange(rows)[:, None], n)[:, 0]
            off = None if blocks.offset is None else blocks.offset[order]
            blocks = Blocks(
                blocks.q[order], blocks.scale[order], blocks.zp[order], off, blocks.bits, blocks.block
            )
        return blocks

    return tensors, load
