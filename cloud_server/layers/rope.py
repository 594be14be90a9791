"""Rotary position embedding, Hugging Face's rotate-half layout.

For position p and pair i (of head_dim/2): theta_i = base^(-2i/d) / factor, and
[x1, x2] -> [x1 cos(p theta) - x2 sin(p theta), x2 cos(p theta) + x1 sin(p theta)],
where x1 and x2 are the first and second halves of the head dimension.
"""

from __future__ import annotations

import math

import torch

from ..exceptions import ModelLoadError


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
        kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
        if kind == "linear":
            inv_freq = inv_freq / float(scaling["factor"])  # type: ignore[index]
        elif kind == "freq_factors":  # llama.cpp's rope_freqs tensor (Llama 3.1 GGUFs)
            inv_freq = inv_freq / torch.tensor(scaling["factors"], dtype=torch.float64)  # type: ignore[index]
        elif kind == "llama3":
            inv_freq = _llama3_scaling(inv_freq, scaling)  # type: ignore[arg-type]
        elif kind not in (None, "default"):
            raise ModelLoadError(f"RoPE scaling {kind!r} is not supported (linear, llama3)")
        # a factor of 0 or NaN (or a rope_freqs entry of 0) made NaN tables, a negative one turned
        # the rotation around: both were silent garbage logits. ValueError: the loader's
        # ModelLoadError names the scaling.
        if not bool(((inv_freq > 0) & torch.isfinite(inv_freq)).all()):
            raise ValueError(f"RoPE frequencies must be finite and positive (base {base}, factors > 0)")
        pos = torch.arange(max_position, dtype=torch.float64)
        angles = torch.outer(pos, inv_freq)  # [max_position, head_dim/2]
        self.cos = angles.cos().to(device=device, dtype=dtype)
        self.sin = angles.sin().to(device=device, dtype=dtype)
        # The rows of the step's positions, looked up once and reused by every layer that shares
        # this table (the same ``positions`` tensor is passed to all of them). Holding the tensor
        # keeps its identity from being reused by a later step's tensor.
        self._rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def forget_rows(self) -> None:
        """Drop the cached rows (a CUDA graph's static positions change contents, not identity)."""
        self._rows = None

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self._rows
        if rows is None or rows[0] is not positions:
            cos = self.cos[positions].unsqueeze(1)  # [T, 1, head_dim/2]
            sin = self.sin[positions].unsqueeze(1)
            rows = self._rows = (positions, cos, sin)
        return rows[1], rows[2]

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [T, num_heads, head_dim]; positions: [T]
        cos, sin = self._cos_sin(positions)
        x1, x2 = x.chunk(2, dim=-1)  # [T, H, head_dim/2] each
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _llama3_scaling(inv_freq: torch.Tensor, cfg: dict) -> torch.Tensor:
    """Llama 3.1: divide low frequencies by ``factor``, keep high ones, blend in between."""
    factor, old_len = float(cfg["factor"]), float(cfg["original_max_position_embeddings"])
    low, high = float(cfg.get("low_freq_factor", 1.0)), float(cfg.get("high_freq_factor", 4.0))
    wavelen = 2 * math.pi / inv_freq  # [head_dim/2]
    smooth = ((old_len / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_len / low, inv_freq / factor, blended)
    return torch.where(wavelen < old_len / high, inv_freq, out)
