"""Linear layers and embeddings whose weights are floats or weight-only int8.

Weight-only int8, one scale per output channel (row):
    s_r = max_c |W[r, c]| / 127,  Q[r, c] = round(W[r, c] / s_r)  in [-127, 127]
    y = x Q^T * s  (torch's CPU kernel ``_weight_int8pack_mm``; elsewhere Q is widened first)
Rows keep their own scales, so fusing layers (q|k|v, gate|up) is a concatenation of rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

QUANTIZATIONS = ("none", "int8")
_INT8_CPU_BLOCK_M = 4  # rows per block of torch's CPU int8 kernel (one weight pass per block)


def int8_row_block(device: torch.device, dtype: torch.dtype, quantization: str) -> int:
    """Rows the matmuls take for the price of one: 4 for int8 weights with bf16 activations on
    CPU (``_weight_int8pack_mm`` works in blocks of 4 rows; the fifth row starts a second pass
    over the weights), else 1 (cost grows smoothly with rows)."""
    cpu_int8 = device.type == "cpu" and quantization == "int8" and dtype == torch.bfloat16
    return _INT8_CPU_BLOCK_M if cpu_int8 else 1


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp weight [out, in] -> (int8 [out, in], fp32 scales [out])."""
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [out]
    q = torch.round(w / scale.unsqueeze(1)).clamp_(-127, 127).to(torch.int8)
    return q, scale


class Linear(nn.Module):
    """``y = x W^T (+ b)``; weights are given later by ``load`` (the model is built on meta)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features, self.has_bias = in_features, out_features, bias
        self.weight: torch.Tensor | None = None  # [out, in] float, or int8 with ``scale``
        self.scale: torch.Tensor | None = None  # [out] in the activation dtype
        self.bias: torch.Tensor | None = None  # [out]

    def load(
        self, weight: torch.Tensor, *, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None
    ) -> None:
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight {tuple(weight.shape)} != {(self.out_features, self.in_features)}")
        if self.has_bias != (bias is not None):
            raise ValueError("bias given to a layer without one, or missing")
        self.weight, self.scale, self.bias = weight.contiguous(), scale, bias

    @property
    def is_int8(self) -> bool:
        return self.scale is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if self.weight is None:
            raise RuntimeError("Linear.load was never called")
        if self.scale is None:
            return F.linear(x, self.weight, self.bias)
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).contiguous()  # [N, in]
        if x2.device.type == "cpu":
            y = torch.ops.aten._weight_int8pack_mm(x2, self.weight, self.scale)  # [N, out]
        else:
            y = F.linear(x2, self.weight.to(x2.dtype)) * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


class Embedding(nn.Module):
    """Token embeddings; int8 rows carry their own scale (the same rows a tied head uses)."""

    def __init__(self, num_embeddings: int, dim: int) -> None:
        super().__init__()
        self.num_embeddings, self.dim = num_embeddings, dim
        self.weight: torch.Tensor | None = None  # [vocab, dim] float or int8
        self.scale: torch.Tensor | None = None  # [vocab]
        self.dtype = torch.float32

    def load(
        self, weight: torch.Tensor, *, scale: torch.Tensor | None = None, dtype: torch.dtype = torch.float32
    ) -> None:
        if tuple(weight.shape) != (self.num_embeddings, self.dim):
            raise ValueError(f"embedding {tuple(weight.shape)} != {(self.num_embeddings, self.dim)}")
        self.weight, self.scale, self.dtype = weight.contiguous(), scale, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, dim]
        if self.weight is None:
            raise RuntimeError("Embedding.load was never called")
        rows = self.weight[ids]  # [T, dim]
        if self.scale is None:
            return rows
        return rows.float() * self.scale[ids].float().unsqueeze(-1)

    def as_linear(self) -> Linear:
        """The tied output head: the same rows (and scales) as a [vocab, dim] projection."""
        head = Linear(self.dim, self.num_embeddings)
        if self.weight is None:
            raise RuntimeError("Embedding.load was never called")
        head.load(self.weight, scale=self.scale)
        return head
