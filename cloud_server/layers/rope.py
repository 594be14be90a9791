"""Rotary position embedding, Hugging Face's rotate-half layout.

For position p and pair i (of head_dim/2): theta_i = base^(-2i/d) / factor, and
[x1, x2] -> [x1 cos(p theta) - x2 sin(p theta), x2 cos(p theta) + x1 sin(p theta)],
where x1 and x2 are the first and second halves of the head dimension.
"""

from __future__ import annotations

import torch


class RotaryEmbedding:
    def __init__(
        self,
        head_dim: int,
        base: float,
        max_position: int,
        *,
        scaling: dict | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        if scaling and scaling.get("rope_type", scaling.get("type")) == "linear":
            inv_freq = inv_freq / float(scaling["factor"])
        pos = torch.arange(max_position, dtype=torch.float64)
        angles = torch.outer(pos, inv_freq)  # [max_position, head_dim/2]
        self.cos = angles.cos().to(device=device, dtype=dtype)
        self.sin = angles.sin().to(device=device, dtype=dtype)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [T, num_heads, head_dim]; positions: [T]
        cos = self.cos[positions].unsqueeze(1)  # [T, 1, head_dim/2]
        sin = self.sin[positions].unsqueeze(1)
        x1, x2 = x.chunk(2, dim=-1)  # [T, H, head_dim/2] each
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
