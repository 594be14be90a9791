"""The Llama family (Llama 2/3, SmolLM2, Mistral- and Qwen2-style configs) in PyTorch.

Pre-norm decoder: x += o_proj(attn(norm(x))); x += down(silu(gate(norm(x))) * up(norm(x))).
Grouped-query attention, rotate-half RoPE, optional q/k/v bias (Qwen2), optional tied head.
The forward pass works on a step's flattened tokens and a paged KV cache.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.attention import AttentionMetadata, paged_attention
from ..layers.norm import RMSNorm
from ..layers.rope import RotaryEmbedding
from .config import ModelConfig


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Multi-head attention with GQA; Gemma 3 adds per-head q/k RMSNorm and a sliding window."""

    def __init__(self, cfg: ModelConfig, *, qk_norm: bool = False, window: int | None = None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        )
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.scale = cfg.attn_scale
        self.window = window

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        positions: torch.Tensor,  # [T]
        kv_cache: torch.Tensor,  # [2, num_slots, KVH, D]
        meta: AttentionMetadata,
        rope: RotaryEmbedding,
    ) -> torch.Tensor:  # [T, hidden]
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)  # [T, H, D]
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)  # [T, KVH, D]
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q, positions), rope(k, positions)
        o = paged_attention(
            q, k, v, kv_cache[0], kv_cache[1], meta, scale=self.scale, window=self.window
        )  # [T, H, D]
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, F.silu)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, positions, kv_cache, meta, rope):  # [T, hidden] -> [T, hidden]
        x = x + self.self_attn(self.input_layernorm(x), positions, kv_cache, meta, rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Body(nn.Module):
    """``model.*`` in Hugging Face names: embeddings, layers, final norm."""

    def __init__(self, cfg: ModelConfig, layers: list[nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """Shared frame of the decoder-only models: embed, layers, norm, (tied) head."""

    embed_scale: float = 1.0

    def __init__(self, cfg: ModelConfig, layers: list[nn.Module]) -> None:
        super().__init__()
        self.config = cfg
        self.model = _Body(cfg, layers)
        self.lm_head = (
            None if cfg.tie_word_embeddings
            else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        )
        self.ropes: list[RotaryEmbedding] = []  # one per layer, built by setup()

    def setup(self, max_position: int) -> None:
        """Build RoPE tables on the weights' device (not parameters: kept out of state dicts)."""
        cfg, w = self.config, self.model.embed_tokens.weight
        self.ropes = [
            RotaryEmbedding(cfg.head_dim, base, max_position, scaling=cfg.rope_scaling,
                            device=w.device, dtype=w.dtype)
            for base in self.rope_bases()
        ]

    def rope_bases(self) -> list[float]:
        return [self.config.rope_theta] * self.config.num_layers

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: torch.Tensor,  # [num_layers, 2, num_slots, KVH, D]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden], after the final norm
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        if self.embed_scale != 1.0:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, positions, kv_caches[i], meta, self.ropes[i])
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return (hidden @ weight.t()).float()


class LlamaForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, [LlamaDecoderLayer(cfg) for _ in range(cfg.num_layers)])
