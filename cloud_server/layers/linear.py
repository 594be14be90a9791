"""Linear layers and embeddings whose weights are floats, weight-only int8 or weight-only int4.

Weight-only int8 in groups of 32 weights along each row, a scale and a zero per group:
    W[r, c] = scale[r, g] * Q[r, c] + zero[r, g],  g = c // 32,  Q an int8
    given as Q int8 [out, in] and scale_zero fp16 [out, in / 32, 2]. A GGUF block of 32 (Q8_0,
    Q5_0, Q4_0, Q4_1) is such a group exactly; float weights are rounded to nearest:
    s = max |W[r, group]| / 127 (in fp16), Q = round(W / s), zero 0 (``quantize_groups``).
    On the CPU ``load`` repacks them for the engine's own kernel (``cpu_kernels``: activations
    rounded to int8 per row and group of 32, integer dot products); without it they become one
    scale per row (``quantize_rows``) for torch's ``_weight_int8pack_mm`` (bf16 activations; fp32
    ones widen the rows on each call, faster there); elsewhere they are widened on each call.
Weight-only int8 with one scale per output channel (row), where a row is not whole groups:
    s_r = max_c |W[r, c]| / 127,  Q[r, c] = round(W[r, c] / s_r)  in [-127, 127],  y = x Q^T * s
Weight-only int4, a GGUF 4-bit tensor's own groups of 32 weights along each row, kept as they are:
    W[r, c] = scale[r, g] * (Q[r, c] - 8) + zero[r, g],  g = c // 32,  Q in 0..15
    given as codes, two per byte (column 2j in the low nibble, 2j + 1 in the high one), and
    scale_zero [out, in / 32, 2]; on the CPU ``load`` repacks them for the engine's own kernel
    (``cpu_kernels``: AVX-512 VNNI, codes and their groups' scale and zero in one array,
    activations rounded to int8 per row and group of 32, integer dot products) or else for torch's
    ``_weight_int4pack_mm_for_cpu``; elsewhere they are widened to the activation dtype once.
Rows keep their own scales (and groups), so fusing layers (q|k|v, gate|up) is a concatenation of rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .cpu_kernels import int4_mm, int8_mm

QUANTIZATIONS = ("none", "int8", "int4")
_CPU_BLOCK_M = 4  # rows per pass over the weights of torch's CPU int8 and int4 kernels
_KERNEL_BLOCK_M = 8  # ... and of the engine's own (cpu_kernels.cpp: kMaxRows)
INT4_GROUP = 32  # weights per (scale, zero) along a row in the int4 format
_INT4_ROWS_MULTIPLE = 16  # torch's int4 CPU packing takes a multiple of 16 output rows
_INT4_PACK_ROWS = 64  # ... and lays rows out in blocks of 64 (a row prefix is a block prefix)
BLOCK_ROWS = 16  # output rows per block of the engine kernels' formats (cpu_kernels.cpp)
INT8_GROUP = 32  # weights per (scale, zero) along a row in the grouped int8 format


def int8_row_block(device: torch.device, dtype: torch.dtype, quantization: str) -> int:
    """Rows the matmuls take in one pass over the weights, for int8 or int4 weights with bf16
    activations on CPU: 8 with the engine's kernels, 4 with torch's ``_weight_int8pack_mm`` /
    ``_weight_int4pack_mm_for_cpu`` (the next row starts a second pass); else 1 (cost grows
    smoothly with rows)."""
    cpu_blocked = device.type == "cpu" and quantization in ("int8", "int4") and dtype == torch.bfloat16
    if not cpu_blocked:
        return 1
    return _KERNEL_BLOCK_M if int4_mm() is not None else _CPU_BLOCK_M


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp weight [out, in] -> (int8 [out, in], fp32 scales [out])."""
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [out]
    if not torch.isfinite(scale).all():  # an inf or NaN weight: an inf or NaN scale, NaN outputs
        raise ValueError("weights not finite: no int8 row scale holds them")
    q = torch.round(w / scale.unsqueeze(1)).clamp_(-127, 127).to(torch.int8)
    return q, scale


def quantize_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp weight [out, in] (in % 32 == 0) -> (int8 [out, in], scale_zero fp16 [out, in / 32, 2]),
    rounded to nearest with the fp16 scale itself (zero 0)."""
    w = w.float().reshape(w.shape[0], -1, INT8_GROUP)
    scale = (w.abs().amax(dim=2) / 127.0).to(torch.float16)  # [out, groups]
    if not torch.isfinite(scale).all():
        raise ValueError("weights too large (or not finite) for fp16 group scales")
    s = scale.float().clamp(min=torch.finfo(torch.float32).tiny).unsqueeze(2)
    q = torch.round(w / s).clamp_(-127, 127).to(torch.int8).reshape(w.shape[0], -1)
    return q, torch.stack((scale, torch.zeros_like(scale)), dim=-1)


def int8_groups_dequantize(q: torch.Tensor, scale_zero: torch.Tensor) -> torch.Tensor:
    """Grouped int8 [out, in] and scale_zero [out, in / 32, 2] -> fp32 [out, in]."""
    sz = scale_zero.float()
    w = q.float().reshape(q.shape[0], -1, INT8_GROUP) * sz[..., 0:1] + sz[..., 1:2]
    return w.reshape(q.shape[0], -1)


def int4_supported(rows: int, cols: int) -> bool:
    """Whether a [rows, cols] matrix can take the int4 format (else it goes to int8 rows)."""
    return rows % _INT4_ROWS_MULTIPLE == 0 and cols % INT4_GROUP == 0


def pack_int4_codes(q: torch.Tensor) -> torch.Tensor:
    """Codes uint8 [out, in] in 0..15 -> two per byte [out, in / 2] (column 2j low, 2j + 1 high)."""
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4_codes(codes: torch.Tensor) -> torch.Tensor:
    """Two-per-byte codes [out, in / 2] -> one code per byte [out, in] (the inverse of pack_int4_codes)."""
    return torch.stack((codes & 0x0F, codes >> 4), dim=-1).reshape(codes.shape[0], -1)


def int4_dequantize(codes: torch.Tensor, scale_zero: torch.Tensor) -> torch.Tensor:
    """Two-per-byte codes [out, in / 2] and scale_zero [out, in / 32, 2] -> fp32 [out, in]."""
    q = unpack_int4_codes(codes).reshape(codes.shape[0], -1, INT4_GROUP)
    sz = scale_zero.float()
    w = sz[..., 0:1] * (q.float() - 8.0) + sz[..., 1:2]  # w = scale * (q - 8) + zero, per group
    return w.reshape(codes.shape[0], -1)


def _pack_int4_for_cpu(codes: torch.Tensor, scale_zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes two per byte [out, in / 2], scale_zero [out, in / 32, 2]) -> torch's CPU int4 layout:
    its own packing of the codes and bf16 scale_zero [in / 32, out, 2]."""
    q = unpack_int4_codes(codes).to(torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    return packed, scale_zero.to(torch.bfloat16).transpose(0, 1).contiguous()


def int8_blocks_fit(rows: int, cols: int) -> bool:
    """Whether a [rows, cols] int8 matrix can take the engine int8 kernel's format."""
    return rows % BLOCK_ROWS == 0 and cols % INT8_GROUP == 0


def pack_int4_blocks(codes: torch.Tensor, scale_zero: torch.Tensor) -> torch.Tensor:
    """(codes two per byte [N, K / 2] (column 2j low, 2j + 1 high), scale_zero [N, K / 32, 2]) ->
    the kernel's format, flat uint8: per block of 16 rows and group of 32 columns, 4 chunks of 64
    bytes (byte 4c + e of chunk i: row c, low nibble column 4i + e, high nibble 16 + 4i + e), then
    16 bf16 scales and 16 bf16 zeros."""
    n, k = codes.shape[0], codes.shape[1] * 2
    if n % BLOCK_ROWS or k % INT4_GROUP:
        raise ValueError(f"int4 kernel format needs rows % 16 == 0 and columns % 32 == 0, got {n}x{k}")
    blocks, groups = n // BLOCK_ROWS, k // INT4_GROUP
    q = unpack_int4_codes(codes).reshape(blocks, BLOCK_ROWS, groups, 2, 4, 4)  # [.., half, chunk i, e]
    chunks = q[:, :, :, 0] | (q[:, :, :, 1] << 4)  # [block, row c, group, chunk i, e]
    chunks = chunks.permute(0, 2, 3, 1, 4).reshape(blocks, groups, 256)
    sz = scale_zero.to(torch.bfloat16).reshape(blocks, BLOCK_ROWS, groups, 2).permute(0, 2, 3, 1)
    sz = sz.contiguous().view(torch.uint8).reshape(blocks, groups, 64)
    return torch.cat((chunks, sz), dim=2).reshape(-1).contiguous()


def pack_int8_scales(scale_zero: torch.Tensor) -> torch.Tensor:
    """scale_zero [N, K / 32, 2] -> the kernel's fp16 [N / 16, K / 32, 2, 16]: per block of 16 rows
    and group, the rows' scales, then their zeros."""
    n, groups = scale_zero.shape[:2]
    sz = scale_zero.to(torch.float16).reshape(n // BLOCK_ROWS, BLOCK_ROWS, groups, 2)
    return sz.permute(0, 2, 3, 1).contiguous()


def pack_int8_blocks(q: torch.Tensor, *, in_place: bool = False) -> torch.Tensor:
    """int8 [N, K] -> the kernel's codes, flat uint8: per block of 16 rows, K / 4 chunks of 64
    bytes (byte 4c + e of chunk j: Q[row c, column 4j + e] + 128, the unsigned side of the kernel's
    integer dot product). Each block's bytes stay where they were, so ``in_place`` (for a tensor
    nobody else holds) rearranges them in q's own memory, 64 blocks at a time: loading then
    allocates no second copy of the matrix."""
    n, k = q.shape
    if not int8_blocks_fit(n, k):
        raise ValueError(f"int8 kernel format needs rows % 16 == 0 and columns % 32 == 0, got {n}x{k}")
    blocks = q.reshape(n // BLOCK_ROWS, BLOCK_ROWS, k // 4, 4)
    if not (in_place and q.is_contiguous()):
        out = blocks.permute(0, 2, 1, 3).reshape(-1).contiguous().view(torch.uint8)
    else:
        for b0 in range(0, blocks.shape[0], 64):
            chunk = blocks[b0 : b0 + 64]
            chunk.reshape(-1).copy_(chunk.permute(0, 2, 1, 3).reshape(-1))  # reshape copies first
        out = q.reshape(-1).view(torch.uint8)
    out ^= 0x80  # two's complement q + 128 as an unsigned byte
    return out


def int8_block_rows(codes: torch.Tensor, scales: torch.Tensor, rows: torch.Tensor, k: int) -> torch.Tensor:
    """Rows ``rows`` [T] of a matrix in the kernel's int8 format (the inverse of
    :func:`pack_int8_blocks` and :func:`pack_int8_scales` for those rows), fp32 [T, k]:
        codes  [N / 16, K / 4, 16, 4] uint8 = q + 128   row r: block r // 16, lane r % 16
        scales [N / 16, K / 32, 2, 16] fp16 (scale, zero) per group of 32 columns
        w = scale * q + zero, group by group (int8_groups_dequantize)."""
    block, lane = rows // BLOCK_ROWS, rows % BLOCK_ROWS
    q = codes.view(-1, k // 4, BLOCK_ROWS, 4)[block, :, lane, :]  # [T, K / 4, 4]
    q = (q ^ 0x80).view(torch.int8).reshape(-1, k)
    return int8_groups_dequantize(q, scales[block, :, :, lane])  # scale_zero [T, K / 32, 2]


class Linear(nn.Module):
    """``y = x W^T (+ b)``; weights are given later by ``load`` (the model is built on meta)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features, self.has_bias = in_features, out_features, bias
        # [out, in] float; int8 with ``scale``; int4 (CPU): torch's packed codes with ``scale``; or
        # (``blocks``) the engine kernels' flat arrays: int8 codes with ``scale``, or int4 codes
        # with their scales and zeros inside (``scale`` None)
        self.weight: torch.Tensor | None = None
        # int8: [out] (one per row), scale_zero [out, in / 32, 2] fp16 (groups), or the kernel's
        # packed fp16 [out / 16, in / 32, 2, 16]; int4 (torch's kernel): scale_zero [in / 32, out, 2] bf16
        self.scale: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None  # [out]
        self.int4 = False
        self.blocks = False  # in the engine kernels' format (``cpu_kernels``)

    def load(
        self, weight: torch.Tensor, *, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
        owned: bool = False,
    ) -> None:
        """``weight``: float [out, in]; int8 [out, in] with ``scale`` [out] or scale_zero
        [out, in / 32, 2]; or int4 codes uint8 [out, in / 2] with ``scale`` = scale_zero
        [out, in / 32, 2] (see the module's docstring). ``owned``: nobody else holds ``weight``, so
        int8 rows may be repacked in its own memory."""
        int4 = weight.dtype == torch.uint8
        shape = (weight.shape[0], weight.shape[1] * 2) if int4 else tuple(weight.shape)
        if shape != (self.out_features, self.in_features):
            raise ValueError(f"weight {shape} != {(self.out_features, self.in_features)}")
        if self.has_bias != (bias is not None):
            raise ValueError("bias given to a layer without one, or missing")
        if (int4 or weight.dtype == torch.int8) and scale is None:
            raise ValueError("int8 and int4 weights come with their scales")
        blocks = False
        on_cpu = weight.device.type == "cpu"
        if weight.dtype == torch.int8:
            assert scale is not None
            grouped = scale.dim() == 3
            if on_cpu and int8_blocks_fit(*shape) and int8_mm() is not None:
                if not grouped:  # one scale per row: the same scale in each of its groups, zero 0
                    per_group = scale.reshape(-1, 1).expand(-1, shape[1] // INT8_GROUP)
                    scale = torch.stack((per_group, torch.zeros_like(per_group)), dim=-1)
                weight, scale = pack_int8_blocks(weight, in_place=owned), pack_int8_scales(scale)
                blocks = True
            elif grouped and on_cpu:  # torch's int8 kernel takes one scale per row
                weight, scale = quantize_rows(int8_groups_dequantize(weight, scale))
        if int4:
            assert scale is not None
            if on_cpu and int4_mm() is not None:
                weight, scale, blocks = pack_int4_blocks(weight, scale), None, True
            elif on_cpu:
                weight, scale = _pack_int4_for_cpu(weight, scale)
            else:  # no int4 kernel used elsewhere: widen once to the activation dtype
                weight, scale, int4 = int4_dequantize(weight, scale).to(scale.dtype), None, False
        self.weight, self.scale, self.bias, self.int4 = weight.contiguous(), scale, bias, int4
        self.blocks = blocks

    def first_rows(self, n: int) -> Linear:
        """A layer computing only outputs 0..n-1 (a draft's head over the first n token ids),
        sharing this layer's weights (views, no copy; int4's small scale_zero is copied, as its
        kernel reads it contiguous). Packed int4 weights are cut at whole blocks of rows (n
        rounded down): 64 in torch's CPU packing, 16 in the engine kernels' (int8 too)."""
        if self.weight is None:
            raise RuntimeError("Linear.load was never called")
        n = max(1, min(n, self.out_features))
        if self.int4 or self.blocks:  # whole blocks of rows, at least one
            rows = BLOCK_ROWS if self.blocks else _INT4_PACK_ROWS
            n = min(max(n - n % rows, rows), self.out_features)
        if n == self.out_features:
            return self
        head = Linear(self.in_features, n, bias=self.has_bias)
        # the kernels' blocks of 16 rows are stored one after another: rows 0..n-1 are a prefix
        per_row = self.weight.numel() // self.out_features
        head.weight = self.weight[: per_row * n] if self.blocks else self.weight[:n]
        if self.scale is not None:  # see ``scale`` in __init__: each layout's row prefix
            if self.int4:
                head.scale = self.scale[:, :n].contiguous()
            else:
                head.scale = self.scale[: n // BLOCK_ROWS] if self.blocks else self.scale[:n]
        head.bias = None if self.bias is None else self.bias[:n]
        head.int4, head.blocks = self.int4, self.blocks
        return head

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if self.weight is None:
            raise RuntimeError("Linear.load was never called")
        scale = self.scale
        if scale is None and not self.blocks:
            return F.linear(x, self.weight, self.bias)
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).contiguous()  # [N, in]
        if self.blocks:  # bf16 activations, fp32 sums (this format only where the kernels are)
            mm4, mm8 = int4_mm(), int8_mm()
            if mm4 is None or mm8 is None:
                raise RuntimeError("weights packed for the engine's CPU kernels, which are not loaded")
            xb = x2.to(torch.bfloat16)
            if self.int4:
                y = mm4(xb, self.weight, self.out_features).to(x2.dtype)
            else:
                assert scale is not None  # the groups' packed scales and zeros
                y = mm8(xb, self.weight, scale).to(x2.dtype)
        elif self.int4:  # the kernel takes bf16 activations only (fp32 has no fast path)
            xb = x2.to(torch.bfloat16)
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.weight, INT4_GROUP, scale)
            y = y.to(x2.dtype)  # [N, out]
        elif scale is not None and scale.dim() == 3:  # int8 groups off the CPU: widened per call
            y = F.linear(x2, int8_groups_dequantize(self.weight, scale).to(x2.dtype))
        elif x2.device.type == "cpu" and x2.dtype == torch.bfloat16 and self.in_features % 16 == 0:
            assert scale is not None
            # torch's kernel reads bf16 activations 16 columns at a time with no tail: at
            # in % 16 != 0 it returns NaN or garbage, or crashes the process (torch 2.13; a per-row
            # matrix is exactly one whose rows are not whole groups of 32), so those go below in fp32
            y = torch.ops.aten._weight_int8pack_mm(x2, self.weight, scale.to(x2.dtype))
        else:
            assert scale is not None
            # y = x (Q s)^T = (x Q^T) * s: widen Q, run the float matmul, scale the columns. On the
            # CPU this is also the fp32 path: torch 2.13's _weight_int8pack_mm has no fast fp32 path on
            # AVX2 (AMD EPYC, 2 cores, SmolLM2's 576 -> 1536, 2026-12-03: 71 ms for 64 rows where this
            # takes 2 ms, 0.76 ms against 0.45 for one row; with bf16 it is the faster, 3.3 and 0.08)
            xk = x2.float() if x2.device.type == "cpu" and x2.dtype == torch.bfloat16 else x2
            y = (F.linear(xk, self.weight.to(xk.dtype)) * scale.to(xk.dtype)).to(x2.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


class Embedding(nn.Module):
    """Token embeddings; int8 rows carry their own scale, int4 rows their groups' scale_zero (the
    same rows a tied head uses)."""

    def __init__(self, num_embeddings: int, dim: int) -> None:
        super().__init__()
        self.num_embeddings, self.dim = num_embeddings, dim
        self.weight: torch.Tensor | None = None  # [vocab, dim] float or int8; int4 [vocab, dim / 2]
        # int8: [vocab] or scale_zero [vocab, dim / 32, 2]; int4: scale_zero [vocab, dim / 32, 2]
        self.scale: torch.Tensor | None = None
        self.dtype = torch.float32
        self._head: Linear | None = None  # a tied int8 head whose kernel blocks hold the rows

    def load(
        self, weight: torch.Tensor, *, scale: torch.Tensor | None = None, dtype: torch.dtype = torch.float32
    ) -> None:
        int4 = weight.dtype == torch.uint8
        shape = (weight.shape[0], weight.shape[1] * 2) if int4 else tuple(weight.shape)
        if shape != (self.num_embeddings, self.dim):
            raise ValueError(f"embedding {shape} != {(self.num_embeddings, self.dim)}")
        self.weight, self.scale, self.dtype = weight.contiguous(), scale, dtype
        self._head = None

    @property
    def loaded(self) -> bool:
        """Whether the rows are here: its own, or a tied head's blocks."""
        return self.weight is not None or self._head is not None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, dim]
        if self._head is not None:
            return self._rows_from_blocks(ids)
        if self.weight is None:
            raise RuntimeError("Embedding.load was never called")
        rows = self.weight[ids]  # [T, dim]
        if self.scale is None:
            return rows
        if rows.dtype == torch.uint8:  # int4 codes: widen this batch's rows only
            return int4_dequantize(rows.reshape(-1, rows.shape[-1]), self.scale[ids].reshape(
                -1, *self.scale.shape[1:])).reshape(*ids.shape, self.dim)
        if self.scale.dim() == 3:  # int8 groups
            return int8_groups_dequantize(rows.reshape(-1, self.dim), self.scale[ids].reshape(
                -1, *self.scale.shape[1:])).reshape(*ids.shape, self.dim)
        return rows.float() * self.scale[ids].float().unsqueeze(-1)

    def as_linear(self) -> Linear:
        """The tied output head: the same rows (and scales) as a [vocab, dim] projection. Where the
        head's int8 kernel repacks them into its blocks, the embedding then reads its rows from
        those blocks and lets its own copy go (SmolLM2-135M: 28 MB). int4 rows are packed again
        for the head's kernel: a second copy of the codes."""
        head = Linear(self.dim, self.num_embeddings)
        if self.weight is None:
            raise RuntimeError("Embedding.load was never called")
        exact = self.scale is not None and self.scale.dim() == 3 and self.scale.dtype == torch.float16
        head.load(self.weight, scale=self.scale)
        # fp16 groups pass into the blocks unchanged, so the rows read back are the same numbers
        # (fp32 row scales would be rounded to fp16 there: those embeddings keep their own copy)
        if exact and head.blocks and not head.int4 and head.scale is not None:
            self._head, self.weight, self.scale = head, None, None
        return head

    def _rows_from_blocks(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the tied head's int8 blocks, fp32 [*ids.shape, dim]."""
        head = self._head
        assert head is not None and head.weight is not None and head.scale is not None
        rows = int8_block_rows(head.weight, head.scale, ids.reshape(-1), self.dim)
        return rows.reshape(*ids.shape, self.dim)
