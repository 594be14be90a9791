"""Start-up sizing: the device, dtype and quantization, the context length and the KV pool's blocks."""

from __future__ import annotations

from typing import Any

from ..config import EngineConfig
from ..exceptions import ConfigError

_CPU_MAX_MODEL_LEN = 4096
_CPU_KV_BYTES = 1 << 30


def _max_len_cap(device_type: str) -> int:
    return _CPU_MAX_MODEL_LEN if device_type == "cpu" else 32768


def plan_pool(config: EngineConfig, model_config: Any, device_type: str, dtype: Any,
              budget: int | None) -> tuple[int, int]:
    """(max_model_len, KV blocks) the engine takes, without checking them: the length given, else
    the model's own capped at 4,096 tokens on a CPU (32,768 on a GPU), and as many whole blocks as
    ``budget`` bytes of pool hold (0 for None). The start-up checks read the same rule."""
    native = model_config.max_position_embeddings
    max_len = config.max_model_len or min(native, _max_len_cap(device_type))
    if budget is None:
        return max_len, 0
    per_block = model_config.kv_bytes_per_token(dtype.itemsize) * config.block_size
    return max_len, budget // per_block


def known_kv_bytes(config: EngineConfig, device_type: str) -> int | None:
    """The KV pool's bytes where known before the weights load: the one given, or the CPU's
    default; None for a GPU's default (half the memory the weights leave free)."""
    return config.kv_cache_memory_bytes or (None if device_type == "cuda" else _CPU_KV_BYTES)


def _resolve_device(config: EngineConfig) -> tuple[Any, Any, str]:
    """(device, activation dtype, quantization): CPU defaults to int4 weights, bf16 activations."""
    import torch

    name = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' but CUDA is not available")
    quantization = config.quantization or ("int4" if device.type == "cpu" else "none")
    dtype_name = config.dtype or (
        "float32" if device.type == "cpu" and quantization == "none" else "bfloat16"
    )
    return device, getattr(torch, dtype_name), quantization


def kv_budget(config: EngineConfig, device: Any) -> int:
    """The KV pool's bytes, once the weights are in: --kv-cache-memory-mb, else the default. On a
    GPU a given size must fit the memory the weights leave free, or the pool's allocation ended the
    start-up in a CUDA out-of-memory traceback (as the draft's pool is checked, spec_setup)."""
    given = config.kv_cache_memory_bytes
    if not given:
        return _default_kv_bytes(device)
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        if given > free:
            raise ConfigError(
                f"the KV pool (--kv-cache-memory-mb) needs {given >> 20} MiB but {device} has "
                f"{free >> 20} MiB free once the weights are in: lower --kv-cache-memory-mb"
            )
    return given


def _default_kv_bytes(device: Any) -> int:
    if device.type != "cuda":
        return _CPU_KV_BYTES
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    return int(free * 0.5)
