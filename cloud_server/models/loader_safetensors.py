"""Load a Hugging Face folder: ``config.json`` + ``*.safetensors`` (how production loads models)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..exceptions import ModelLoadError
from .config import ModelConfig, gemma3_layer_types

_LLAMA_TYPES = {"llama", "mistral", "qwen2", "smollm", "smollm2"}
_GEMMA3_TYPES = {"gemma3", "gemma3_text"}


def config_from_hf(raw: dict[str, Any]) -> ModelConfig:
    model_type = raw.get("model_type", "")
    if model_type == "gemma3" and "text_config" in raw:
        raw = {**raw["text_config"], "model_type": "gemma3_text"}
        model_type = "gemma3_text"
    hidden, num_heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    common: dict[str, Any] = dict(
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        head_dim=int(raw.get("head_dim") or hidden // num_heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        rope_scaling=raw.get("rope_scaling"),
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
    )
    if model_type in _LLAMA_TYPES:
        bias = bool(raw.get("attention_bias", model_type == "qwen2"))
        return ModelConfig(architecture="llama", attention_bias=bias, **common)
    if model_type in _GEMMA3_TYPES:
        n = common["num_layers"]
        common["tie_word_embeddings"] = True
        return ModelConfig(
            architecture="gemma3",
            rope_local_theta=float(raw.get("rope_local_base_freq", 10000.0)),
            sliding_window=int(raw.get("sliding_window") or 512),
            layer_types=list(raw.get("layer_types") or gemma3_layer_types(
                n, int(raw.get("sliding_window_pattern", 6)))),
            query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar") or common["head_dim"]),
            **common,
        )
    raise ModelLoadError(f"unsupported model_type {model_type!r} in config.json")


def load_safetensors_folder(folder: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Returns (config, HF-named tensors in the engine's conventions)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(f"{folder} has no config.json")
    config = config_from_hf(json.loads(cfg_path.read_text()))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has no *.safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            name = name.replace("language_model.model.", "model.").replace(
                "model.language_model.", "model.")
            if config.architecture == "gemma3" and name.endswith("norm.weight"):
                t = t.float() + 1.0  # HF Gemma stores w; the engine multiplies by (1 + w)
            tensors[name] = t
    if "lm_head.weight" not in tensors:
        config.tie_word_embeddings = True
    elif config.tie_word_embeddings:
        tensors.pop("lm_head.weight")
    return config, tensors
