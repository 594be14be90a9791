"""RMSNorm with the engine's weight convention ``y = x / rms(x) * w`` (computed in fp32).

``out_dtype`` (set by the loader) is the activation dtype of the matmuls that follow, so the
residual stream can stay in fp32 while bf16 runs the projections.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.dim = dim
        self.weight = nn.Parameter(torch.ones(dim))
        self.out_dtype: torch.dtype | None = None  # None: the input's dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        # y = x * rsqrt(mean(x^2) + eps) * w, all in fp32, then the matmuls' dtype. On fp32 input
        # torch's rms_norm computes exactly the written-out ops on CPU (the engine's logits are
        # bit-identical either way) and dispatches to one fused kernel on CUDA instead of six:
        # two norms per layer are a good part of a decode step's ~1,100 kernels.
        y = F.rms_norm(x.float(), (self.dim,), self.weight.float(), self.eps)
        return y.to(self.out_dtype or x.dtype)
