"""The Llama family (Llama 2/3, SmolLM2, Mistral- and Qwen2-style configs) in PyTorch.

Pre-norm decoder: x += o_proj(attn(norm(x))); x += down(silu(gate(norm(x))) * up(norm(x))).
Grouped-query attention, rotate-half RoPE, optional q/k/v bias (Qwen2), optional tied head.
q/k/v are one fused projection, and so are gate/up (one matmul each instead of three and two).
The forward pass works on a step's flattened tokens and a paged KV cache.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.attention import AttentionMetadata, paged_attention
from ..layers.linear import Embedding, Linear
from ..layers.norm import RMSNorm
from ..layers.rope import RotaryEmbedding
from .config import ModelConfig


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = Linear(hidden, 2 * intermediate)  # rows: gate, then up
        self.down_proj = Linear(intermediate, hidden)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)  # [T, I] each
        return self.down_proj(self.act(gate) * up)


class Attention(nn.Module):
    """Multi-head attention with GQA; Gemma 3 adds per-head q/k RMSNorm and a sliding window."""

    def __init__(self, cfg: ModelConfig, *, qk_norm: bool = False, window: int | None = None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        )
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size,
                               bias=cfg.attention_bias)  # rows: q, then k, then v
        self.o_proj = Linear(self.q_size, cfg.hidden_size)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.scale = cfg.attn_scale
        self.window = window

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        positions: torch.Tensor,  # [T]
        kv_cache: torch.Tensor,  # [2, KVH, num_slots, D]
        meta: AttentionMetadata,
        rope: RotaryEmbedding,
    ) -> torch.Tensor:  # [T, hidden]
        t = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, q_size + 2 * kv_size]
        v = qkv[:, self.q_size + self.kv_size :].reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = qkv[:, : self.q_size + self.kv_size].split((self.q_size, self.kv_size), dim=-1)
            q = self.q_norm(q.reshape(t, self.num_heads, self.head_dim))  # [T, H, D]
            k = self.k_norm(k.reshape(t, self.num_kv_heads, self.head_dim))  # [T, KVH, D]
            q, k = rope(q, positions), rope(k, positions)
        else:  # q and k rotate as one [T, H + KVH, D] tensor: elementwise, so the same values
            qk = rope(qkv[:, : self.q_size + self.kv_size].reshape(
                t, self.num_heads + self.num_kv_heads, self.head_dim), positions)
            q, k = qk.split((self.num_heads, self.num_kv_heads), dim=1)
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
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """Shared frame of the decoder-only models: embed, layers, norm, (tied) head."""

    embed_scale: float = 1.0

    def __init__(self, cfg: ModelConfig, layers: list[nn.Module]) -> None:
        super().__init__()
        self.config = cfg
        self.model = _Body(cfg, layers)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)  # tied: shares the embedding
        self.ropes: list[RotaryEmbedding] = []  # one per layer, built by setup()

    def setup(self, max_position: int, device: torch.device, dtype: torch.dtype) -> None:
        """Build RoPE tables in the activation dtype (not parameters: kept out of state dicts)."""
        cfg = self.config
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.out_dtype = dtype
        tables: dict[float, RotaryEmbedding] = {}  # layers with one base share one table
        self.ropes = [
            tables.get(base) or tables.setdefault(base, RotaryEmbedding(
                cfg.head_dim, base, max_position, scaling=cfg.rope_scaling, device=device,
                dtype=dtype))
            for base in self.rope_bases()
        ]

    def rope_bases(self) -> list[float]:
        return [self.config.rope_theta] * self.config.num_layers

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: torch.Tensor,  # [num_layers, 2, KVH, num_slots, D]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden], after the final norm
        # The residual stream is fp32 whatever the activation dtype: each layer adds its bf16
        # (or fp32) output to it, and the norms hand the projections their own dtype.
        x = self.model.embed_tokens(input_ids).float()  # [T, hidden]
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        for i, layer in enumerate(self.model.layers):
            x = layer(x, positions, kv_caches[i], meta, self.ropes[i])
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor, head: Linear | None = None) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] fp32; ``head``: another output head over these hidden
        states (a draft's first rows of ``lm_head``, ``Linear.first_rows``)."""
        return (self.lm_head if head is None else head)(hidden).float()


class LlamaForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, [LlamaDecoderLayer(cfg) for _ in range(cfg.num_layers)])
