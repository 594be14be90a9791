"""RMSNorm with the engine's weight convention ``y = x / rms(x) * w`` (computed in fp32).

``out_dtype`` (set by the loader) is the activation dtype of the matmuls that follow, so the
residual stream can stay in fp32 while bf16 runs the projections.
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.out_dtype: torch.dtype | None = None  # None: the input's dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(self.out_dtype or x.dtype)
