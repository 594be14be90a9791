"""Gemma 3 (text) in PyTorch.

Differences from Llama: embeddings scaled by sqrt(hidden); per-head RMSNorm on q and k; norms
after attention and after the MLP as well as before; GeLU(tanh) gating; a tied output head;
five sliding-window layers (window 512, RoPE base 10k) per global layer (RoPE base 1M); queries
scaled by query_pre_attn_scalar^-1/2. Norm weights are the effective ones (HF's 1 + w).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.norm import RMSNorm
from .config import ModelConfig
from .llama import Attention, CausalLM, GatedMLP


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_type: str) -> None:
        super().__init__()
        window = cfg.sliding_window if layer_type == "sliding_attention" else None
        self.self_attn = Attention(cfg, qk_norm=True, window=window)
        gelu_tanh = functools.partial(F.gelu, approximate="tanh")
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, gelu_tanh)
        eps = cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, eps)

    def forward(self, x, positions, kv_cache, meta, rope):  # [T, hidden] -> [T, hidden]
        h = self.self_attn(self.input_layernorm(x), positions, kv_cache, meta, rope)
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(h)


class Gemma3ForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, [Gemma3DecoderLayer(cfg, t) for t in cfg.layer_types])
        self.embed_scale = cfg.hidden_size**0.5

    def rope_bases(self) -> list[float]:
        cfg = self.config
        return [
            cfg.rope_local_theta if t == "sliding_attention" else cfg.rope_theta
            for t in cfg.layer_types
        ]

    def setup(self, max_position: int, device: torch.device, dtype: torch.dtype) -> None:
        super().setup(max_position, device, dtype)
        # Only global layers take the checkpoint's RoPE scaling; local layers never scale.
        from ..layers.rope import RotaryEmbedding

        cfg = self.config
        for i, t in enumerate(cfg.layer_types):
            if t == "sliding_attention" and cfg.rope_scaling:
                self.ropes[i] = RotaryEmbedding(
                    cfg.head_dim, cfg.rope_local_theta, max_position, device=device, dtype=dtype
                )
