"""Resolve a model reference (catalog id, .gguf path, HF folder) and build the torch model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..exceptions import ModelLoadError
from .config import ModelConfig


@dataclass
class LoadedModel:
    name: str
    config: ModelConfig
    model: nn.Module
    tokenizer: Any


def resolve_model_path(model: str) -> tuple[str, Path]:
    """(display name, path): catalog ids are materialized with hybridllm.models.pull."""
    path = Path(model).expanduser()
    if path.suffix == ".gguf" or path.is_dir():
        if not path.exists():
            raise ModelLoadError(f"model path {path} does not exist")
        return (path.stem if path.is_file() else path.name), path
    try:
        from hybridllm.models import pull
        from hybridllm.models.catalog import get_spec

        spec = get_spec(model)
        return spec.id, Path(pull(model))
    except ModelLoadError:
        raise
    except Exception as exc:  # the client package's own errors, mapped at the boundary
        raise ModelLoadError(f"cannot resolve model {model!r}: {exc}") from exc


def build_model(
    config: ModelConfig,
    tensors: dict[str, Any],
    *,
    device: torch.device,
    dtype: torch.dtype,
    max_position: int,
) -> nn.Module:
    from .gemma3 import Gemma3ForCausalLM
    from .llama import LlamaForCausalLM

    cls = Gemma3ForCausalLM if config.architecture == "gemma3" else LlamaForCausalLM
    with torch.device("meta"):
        model = cls(config)
    state = {
        name: (torch.from_numpy(t) if not isinstance(t, torch.Tensor) else t).to(device, dtype)
        for name, t in tensors.items()
    }
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        msg = f"weights do not match the {config.architecture} layout: {exc}"
        raise ModelLoadError(msg) from exc
    model.eval().requires_grad_(False)
    model.setup(max_position)
    return model


def load_model(
    model: str, *, device: torch.device, dtype: torch.dtype, max_position: int | None = None
) -> LoadedModel:
    name, path = resolve_model_path(model)
    if path.is_dir():
        from .loader_safetensors import load_safetensors_folder
        from .tokenizer import HFTokenizer

        config, tensors_pt = load_safetensors_folder(path)
        tensors: dict[str, Any] = dict(tensors_pt)
        tokenizer: Any = HFTokenizer(path)
    else:
        from .loader_gguf import load_gguf
        from .tokenizer import GGUFTokenizer

        config, tensors_np, _ = load_gguf(path)
        tensors = dict(tensors_np)
        tokenizer = GGUFTokenizer(path)
    max_pos = min(max_position or config.max_position_embeddings, config.max_position_embeddings)
    net = build_model(config, tensors, device=device, dtype=dtype, max_position=max_pos)
    return LoadedModel(name=name, config=config, model=net, tokenizer=tokenizer)
