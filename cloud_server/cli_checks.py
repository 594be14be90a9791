"""The serve command's checks before anything loads: the model, its header, the device, the memory."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from cloud_server.cli_parser import UsageError


def _check_model(model: str, option: str = "--model") -> None:
    """Fail before binding when the model is neither a file or folder nor a catalog id, or is a
    file or folder the loader cannot take (it reads a path as a model only when it is a folder or
    ends in .gguf: another file was looked up as a catalog id once the server had started)."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"{option}: folder {model!r} has no config.json: give a Hugging Face "
                             "model folder (config.json, *.safetensors, tokenizer.json)")
        return
    if path.exists():
        if path.suffix != ".gguf":
            raise UsageError(f"{option}: {model!r} is not a .gguf file (a GGUF model's name ends "
                             "in .gguf) nor a Hugging Face model folder")
        return
    from hybridllm.models import load_catalog

    known = sorted(load_catalog())
    if model not in known:
        raise UsageError(
            f"{option}: {model!r} is neither an existing file or folder nor a catalog id "
            f"({', '.join(known)})"
        )


def _check_power_env(power_watts: float | None) -> None:
    """Refuse a bad ``HYBRIDLLM_POWER_WATTS`` before the load, by the energy meter's own rule
    (``check_watts``): the meter (each replica's with --replicas) reads it once the model has
    loaded, minutes in. Empty is unset, and under --power-watts it is not read, as the meter."""
    value = os.environ.get(POWER_WATTS_ENV)
    if power_watts is not None or not value:
        return
    from cloud_server.energy_sources import check_watts

    try:
        check_watts(value, POWER_WATTS_ENV)
    except ValueError as exc:
        raise UsageError(f"{exc}: set it to the power this machine draws in watts (e.g. 300), "
                         "or unset it") from exc


POWER_WATTS_ENV = "HYBRIDLLM_POWER_WATTS"  # the estimate's figure (cloud_server/energy.py)


def _check_model_header(args: argparse.Namespace, config: Any, cluster: bool) -> None:
    """Refuse what the models' headers already rule out (read without the weights; the engine
    found it only once the server had started, exit 1): a ``--max-model-len`` beyond the model's
    context length, a KV pool that cannot hold one sequence (on a CPU, with a draft model's own
    pool beyond it, more than the memory), a ``--draft-model`` whose vocabulary
    or end-of-sequence ids are not the target's (the load compares the tokenizers in full) or whose
    context is shorter than the target's (every step past it failed). A model whose header cannot
    be read here (a catalog model not pulled yet) is left to the load."""
    from cloud_server.models.header import read_model_header

    target = read_model_header(args.model)
    if target is None:
        return
    native = target.config.max_position_embeddings
    if args.max_model_len is not None and args.max_model_len > native:
        raise UsageError(f"--max-model-len {args.max_model_len} is more than the context length of "
                         f"{args.model!r} ({native} tokens): give at most {native} or leave it out")
    from cloud_server.engine.pool_plan import _resolve_device, known_kv_bytes, plan_pool

    # the engine's own plan: a replica's device is its own (its pool is checked there); here the
    # pool is checked where known before the load (given, or the CPU's default)
    budget = None
    if cluster:
        max_len, _ = plan_pool(config, target.config, (config.device or "cpu").partition(":")[0], None, None)
    else:
        device, dtype, _ = _resolve_device(config)
        budget = known_kv_bytes(config, device.type)
        max_len, num_blocks = plan_pool(config, target.config, device.type, dtype, budget)
        if budget is not None and num_blocks * config.block_size < max_len:
            raise UsageError(
                f"a KV pool of {budget >> 20} MiB (--kv-cache-memory-mb) holds "
                f"{num_blocks * config.block_size} tokens of {config.model!r} in blocks of "
                f"{config.block_size} (--block-size), less than one sequence of {max_len} "
                f"(--max-model-len): raise --kv-cache-memory-mb or lower --max-model-len"
            )
    draft = read_model_header(args.draft_model) if args.draft_model is not None else None
    if draft is None:
        return
    differs = None
    # token counts of two GGUF tokenizers; a folder's embedding rows may be padded, so two folders
    # (or a folder and a GGUF) are left to the engine's check, which compares the tokenizers
    if None not in (draft.tokens, target.tokens) and draft.tokens != target.tokens:
        differs = f"vocabulary of {draft.tokens} tokens, the target's {target.tokens}"
    elif None not in (draft.eos_token_ids, target.eos_token_ids) and (
        draft.eos_token_ids != target.eos_token_ids
    ):
        differs = (f"end-of-sequence token ids {sorted(draft.eos_token_ids or ())}, the target's "
                   f"{sorted(target.eos_token_ids or ())}")
    if differs:
        raise UsageError(f"--draft-model {args.draft_model!r} does not share the tokenizer of "
                         f"--model {args.model!r} (its {differs}): a draft model must use the "
                         "target's tokenizer")
    # the draft runs every position the target does: past its own RoPE table every step failed
    draft_len = draft.config.max_position_embeddings
    if draft_len < max_len:
        raise UsageError(f"--draft-model {args.draft_model!r} has a context length of {draft_len} "
                         f"tokens, less than the target's {max_len} (--max-model-len): give "
                         f"--max-model-len {draft_len} or less")
    # The draft keeps a KV pool of its own beside the target's, as many blocks (the target's block
    # tables index both), at its own bytes a token: beyond --kv-cache-memory-mb. On the CPU the two
    # together must fit in memory (before, only the target's pool was compared with it).
    total = _memory_bytes()
    if budget is None or device.type != "cpu" or total is None:
        return
    draft_bytes = num_blocks * config.block_size * draft.config.kv_bytes_per_token(dtype.itemsize)
    if budget + draft_bytes > total:
        raise UsageError(f"--kv-cache-memory-mb {budget >> 20} and the draft model's own KV pool of "
                         f"{draft_bytes >> 20} MiB (as many blocks, of {args.draft_model!r}) are "
                         f"together more than this machine's memory ({total >> 20} MiB): lower "
                         "--kv-cache-memory-mb")


def _check_device(config: Any) -> None:
    """Refuse before the load a device this machine lacks (``--device cuda`` without CUDA, or
    ``cuda:N`` past its GPUs: the server started, then the load failed) and, on the CPU, a KV pool
    larger than its memory (mapped lazily: refused only after the weights had loaded, if at all).
    Single-process server only: a Ray cluster's replicas run elsewhere."""
    import torch

    name = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    kind, _, index = name.partition(":")
    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(index or 0) >= count:
            raise UsageError(f"--device {name}: this machine has "
                             f"{f'{count} CUDA device(s)' if count else 'no CUDA device'}")
        return
    total = _memory_bytes()
    if total is None:
        return
    if config.kv_cache_memory_bytes is not None and config.kv_cache_memory_bytes > total:
        raise UsageError(f"--kv-cache-memory-mb {config.kv_cache_memory_bytes >> 20} is more than "
                         f"this machine's memory ({total >> 20} MiB)")


def _memory_bytes() -> int | None:
    """This machine's physical memory, or None where it is not known (Windows)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
