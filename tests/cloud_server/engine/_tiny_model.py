"""A random one-layer Llama (vocabulary 64, hidden size 32) built in milliseconds, for tests that
need a real forward pass (paged attention, sampling, a draft model) without weights on disk."""

from __future__ import annotations

import torch

from cloud_server.engine.model_runner import ModelRunner
from cloud_server.models.config import ModelConfig
from cloud_server.models.loader import assemble_model, convert_weights

CPU = torch.device("cpu")


def tiny_config(intermediate_size: int = 48) -> ModelConfig:
    """64 ids, hidden 32, one layer, 4 query heads and 2 KV heads of 8."""
    return ModelConfig("llama", 64, 32, intermediate_size, 1, 4, 2, 8)


def tiny_weights(cfg: ModelConfig, *, scale: float = 1.0, seed: int = 0) -> dict[str, torch.Tensor]:
    """HF-named fp32 tensors: normal(0, ``scale``) matrices, norm weights of 1."""
    g = torch.Generator().manual_seed(seed)
    d, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    kv = cfg.num_kv_heads * cfg.head_dim
    layer = "model.layers.0."
    shapes = {"model.embed_tokens.weight": (v, d), "lm_head.weight": (v, d),
              "model.norm.weight": None, layer + "input_layernorm.weight": None,
              layer + "post_attention_layernorm.weight": None,
              layer + "self_attn.q_proj.weight": (d, d),
              layer + "self_attn.k_proj.weight": (kv, d),
              layer + "self_attn.v_proj.weight": (kv, d),
              layer + "self_attn.o_proj.weight": (d, d),
              layer + "mlp.gate_proj.weight": (f, d),
              layer + "mlp.up_proj.weight": (f, d),
              layer + "mlp.down_proj.weight": (d, f)}
    return {k: torch.ones(d) if s is None else torch.randn(*s, generator=g) * scale
            for k, s in shapes.items()}


def tiny_model(cfg: ModelConfig, tensors: dict[str, torch.Tensor], *, dtype: torch.dtype = torch.float32,
               quantization: str = "none"):
    """The model of ``tensors`` on the CPU (``tensors`` is left as it was)."""
    weights = convert_weights(dict(tensors), device=CPU, dtype=dtype, quantization=quantization)
    return assemble_model(cfg, weights, device=CPU, dtype=dtype, max_position=64)


def tiny_runner(model, cfg: ModelConfig, *, num_blocks: int, block_size: int,
                dtype: torch.dtype = torch.float32) -> ModelRunner:
    return ModelRunner(model, cfg, num_blocks=num_blocks, block_size=block_size, device=CPU, dtype=dtype)
