"""Resolve a model reference (catalog id, .gguf path, HF folder) and build the torch model."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..exceptions import ModelLoadError
from ..layers.linear import (
    INT8_GROUP,
    QUANTIZATIONS,
    Embedding,
    Linear,
    quantize_groups,
    quantize_rows,
    unpack_int4_codes,
)
from .config import ModelConfig
from .finite import all_finite, check_converted, not_finite_error
from .loader_gguf import RowChunks, is_quantized


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
    if path.is_file():  # a model.safetensors (or .bin) given for its folder: not a catalog id
        raise ModelLoadError(f"model path {path} is a file but not a .gguf; pass a .gguf file or the "
                             f"Hugging Face folder that holds it ({path.parent})")
    if "/" in model or "\\" in model or model.startswith(("~", ".")):  # a path; ids have no "/"
        raise ModelLoadError(f"model path {path} does not exist (nor is {model!r} a catalog id: "
                             "`hybridllm models list` names them; hub ids are not downloaded)")
    try:
        from hybridllm._progress import ProgressBar
        from hybridllm.models import pull
        from hybridllm.models.catalog import get_spec

        spec = get_spec(model)  # the first run assembles the file (a bar on stderr)
        bar = ProgressBar(f"Preparing {spec.id}")
        try:
            return spec.id, Path(pull(model, progress=bar))
        finally:  # cut short (a failure, Ctrl-C): end its line, so the error starts one of its own
            bar.close()
    except ModelLoadError:
        raise
    except Exception as exc:  # the client package's own errors, mapped at the boundary
        raise ModelLoadError(f"cannot resolve model {model!r}: {exc}") from exc


_FUSED = {  # fused layer <- its Hugging Face parts, rows in this order
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
_PART_OF = {part: fused for fused, parts in _FUSED.items() for part in parts}


def build_model(
    config: ModelConfig,
    tensors: Iterable[tuple[str, Any]] | dict[str, Any],
    *,
    device: torch.device,
    dtype: torch.dtype,
    max_position: int,
    quantization: str = "none",
) -> nn.Module:
    """Build the model from HF-named fp tensors, converting each as it arrives.

    Each tensor is cast (or int8-quantized, ``quantization="int8"``) on arrival, so the peak
    memory is the final model plus one fp32 tensor; the parts of fused layers are joined by rows.
    Matrices that come as int4 or int8 bands (``iter_gguf_tensors(..., quantization=...)``: a
    GGUF's own blocks) are taken as they are; other matrices are int8-quantized.
    """
    weights = convert_weights(tensors, device=device, dtype=dtype, quantization=quantization)
    return assemble_model(config, weights, device=device, dtype=dtype, max_position=max_position)


def convert_weights(
    tensors: Iterable[tuple[str, Any]] | dict[str, Any],
    *,
    device: torch.device,
    dtype: torch.dtype,
    quantization: str = "none",
    origin: Callable[[str], str] | None = None,
) -> dict[str, Any]:
    """HF-named fp tensors -> {name: tensor in ``dtype``, or for matrices (int8, fp16 scale_zero of
    its groups), (int8, scales of its rows, where a row is not whole groups) or (int4 codes uint8,
    scale_zero) (the formats of ``layers.linear``)}. A NaN or inf weight (or block scale) is a
    ModelLoadError naming the tensor and its file, ``origin(name)``."""
    if quantization not in QUANTIZATIONS:
        raise ModelLoadError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    items = tensors.items() if isinstance(tensors, dict) else tensors
    weights: dict[str, Any] = {}  # name -> tensor, or (int8 | int4 codes, scale) for matrices
    num_loaded = 0
    for name, raw in items:
        quantize = quantization != "none" and is_quantized(name)
        chunks = raw if isinstance(raw, RowChunks) else [raw]  # big matrices come in row bands
        rows = raw.raw.shape[0] if isinstance(raw, RowChunks) else None
        parts = _Bands(rows)  # float row bands, or int8 / int4 codes when quantizing
        scales = _Bands(rows)
        where = origin(name) if origin is not None else ""
        for chunk in chunks:
            if isinstance(chunk, tuple):  # an int4 or int8 band: (codes, scale_zero), kept as they are
                if not quantize:
                    raise ModelLoadError(f"{name}: quantized bands given to a {quantization!r} conversion")
                if not all_finite(chunk[1]):  # codes are integers: only a scale can be NaN or inf
                    raise not_finite_error(name, where, chunk[1], row_offset=parts.filled,
                                           what="block scales")
                parts.add(chunk[0].to(device))
                scales.add(chunk[1].to(device))
                del chunk
                continue
            t = torch.from_numpy(chunk) if not isinstance(chunk, torch.Tensor) else chunk
            if quantize:
                grouped = t.shape[-1] % INT8_GROUP == 0
                try:
                    q, s = quantize_groups(t.to(device)) if grouped else quantize_rows(t.to(device))
                except ValueError as exc:  # a NaN or inf, or weights fp16 scales cannot hold
                    if not all_finite(t):
                        raise not_finite_error(name, where, t, row_offset=parts.filled) from None
                    raise ModelLoadError(f"{name}: {exc}; load it with quantization='none'") from exc
                parts.add(q)
                scales.add(s)
                del q, s
            else:
                out = t.to(device, dtype)
                check_converted(name, where, t, out, parts.filled)
                parts.add(out)
                del out
            del t, chunk
        joined = parts.joined()
        if quantize:
            scale = scales.joined()
            if not (joined.dtype == torch.int8 and scale.dim() == 3):  # int8 groups keep fp16
                scale = scale.to(dtype)
            weights[name] = (joined, scale)
        else:
            weights[name] = joined
        del parts, scales, raw
        num_loaded += 1
        if num_loaded % 8 == 0:  # scratch memory of dequantization goes back as we go
            _return_freed_memory()
    return weights


class _Bands:
    """A matrix's row bands joined as they come: into one tensor of the matrix's ``rows``,
    allocated at the first band (no second copy at the end, as a concatenation would make), or,
    rows unknown (one band), that band itself."""

    def __init__(self, rows: int | None) -> None:
        self.rows, self.filled = rows, 0
        self.out: torch.Tensor | None = None

    def add(self, band: torch.Tensor) -> None:
        if self.rows is None:
            if self.out is not None:
                raise ValueError("several bands for a matrix of unknown rows")
            self.out = band
            return
        if self.out is None:
            self.out = torch.empty((self.rows, *band.shape[1:]), dtype=band.dtype, device=band.device)
        self.out[self.filled : self.filled + band.shape[0]].copy_(band)
        self.filled += band.shape[0]

    def joined(self) -> torch.Tensor:
        if self.out is None or (self.rows is not None and self.filled != self.rows):
            raise ValueError(f"bands cover {self.filled} of {self.rows} rows")
        return self.out


def assemble_model(
    config: ModelConfig,
    weights: dict[str, Any],
    *,
    device: torch.device,
    dtype: torch.dtype,
    max_position: int,
    consume: bool = False,
) -> nn.Module:
    """Put converted weights (``convert_weights``) into a new model of ``config``'s architecture.

    ``consume=True`` empties ``weights`` as its tensors are placed, so each one given up (a matrix
    repacked for a kernel, parts fused into one layer) is freed at once: loading then peaks near
    the model's own size instead of twice it."""
    from .gemma3 import Gemma3ForCausalLM
    from .llama import LlamaForCausalLM

    cls = Gemma3ForCausalLM if config.architecture == "gemma3" else LlamaForCausalLM
    model: Any = cls(config)
    if not consume:
        weights = dict(weights)
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    try:
        _assign(model, weights, dtype, owned=consume)
    except (KeyError, ValueError, RuntimeError) as exc:
        msg = f"weights do not match the {config.architecture} layout: {exc}"
        raise ModelLoadError(msg) from exc
    model.eval().requires_grad_(False)
    try:  # RoPE tables: a scaling the config check let through (factors of the wrong length)
        model.setup(max_position, device, dtype)
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        msg = f"cannot set up the {config.architecture} model (RoPE {config.rope_scaling!r}): {exc}"
        raise ModelLoadError(msg) from exc
    return model


def _assign(model: Any, weights: dict[str, Any], dtype: torch.dtype, owned: bool = False) -> None:
    """Put every tensor in its module; fused layers take their parts' rows in order. ``owned``: the
    tensors are given up (int8 rows may be repacked in their own memory)."""
    modules = dict(model.named_modules())
    fused: dict[str, dict[str, Any]] = {}
    for name in list(weights):
        module_name, _, kind = name.rpartition(".")
        prefix, _, local = module_name.rpartition(".layers.")
        head, _, sub = local.partition(".")  # layer index, "self_attn.q_proj"
        if sub in _PART_OF:
            key = f"{prefix}.layers.{head}.{_PART_OF[sub]}"
            fused.setdefault(key, {})[f"{sub}.{kind}"] = weights.pop(name)
    for key, parts in fused.items():
        sub_names = _FUSED[key.split(".layers.", 1)[1].split(".", 1)[1]]
        layer = key.rsplit(".", 2)[0]  # model.layers.N
        if key not in modules:  # a layer past the config's num_layers (or not a number)
            raise ValueError(f"unexpected tensors {[f'{layer}.{n}' for n in sorted(parts)]}")
        # every part's weight, and each part's bias or none (some biases: rows of the fused
        # bias would not match its layer's, a failure at the first request)
        needed = [f"{p}.weight" for p in sub_names]
        if any(f"{p}.bias" in parts for p in sub_names):
            needed += [f"{p}.bias" for p in sub_names]
        lacking = [f"{layer}.{n}" for n in needed if n not in parts]
        if lacking:
            raise ValueError(f"missing {', '.join(lacking)}")
        mats = [parts.pop(f"{p}.weight") for p in sub_names]
        biases = [parts.pop(f"{p}.bias") for p in sub_names if f"{p}.bias" in parts]
        if parts:
            raise ValueError(f"unexpected tensors {[f'{layer}.{n}' for n in sorted(parts)]}")
        _load_linear(modules[key], mats, biases or None, name=key)
    embed = modules["model.embed_tokens"]
    e = weights.pop("model.embed_tokens.weight")
    if isinstance(e, tuple):
        embed.load(e[0], scale=e[1], dtype=dtype)
    else:
        embed.load(e, dtype=dtype)
    if "lm_head.weight" in weights:
        _load_linear(modules["lm_head"], [weights.pop("lm_head.weight")], None, owned, name="lm_head")
    else:
        model.lm_head = embed.as_linear()
    placed = set()  # the plain parameters given (a norm not given would keep its initial ones)
    for name in list(weights):  # norms and the rest: plain parameters
        t = weights.pop(name)
        module_name, _, kind = name.rpartition(".")
        module = modules.get(module_name)
        if module is None or (isinstance(module, Linear) and kind != "weight"):  # o_proj.bias
            raise ValueError(f"unexpected tensor {name}")
        if isinstance(module, Linear):
            _load_linear(module, [t], None, owned, name=module_name)
            continue
        old = getattr(module, kind)
        if tuple(old.shape) != tuple(t.shape):
            raise ValueError(f"{name}: shape {tuple(t.shape)} != {tuple(old.shape)}")
        setattr(module, kind, nn.Parameter(t, requires_grad=False))
        placed.add(name)
    missing = [n for n, m in model.named_modules()
               if (isinstance(m, Linear) and m.weight is None) or (isinstance(m, Embedding) and not m.loaded)]
    missing += [n for n, _ in model.named_parameters() if n not in placed]  # the norms
    if missing:
        raise ValueError(f"missing weights for {missing[:5]}"
                         + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""))


def _load_linear(module: Any, mats: list[Any], biases: list[Any] | None, owned: bool = False,
                 name: str = "") -> None:
    """``owned``: the caller gave the tensors up (a fused layer's concatenation is always new).
    ``name``: the layer's, in the error of weights that do not fit it."""
    try:
        _load_linear_parts(module, mats, biases, owned)
    except ValueError as exc:  # Linear.load's "bias given to a layer without one": say which
        raise ValueError(f"{name}: {exc}" if name else str(exc)) from exc


def _load_linear_parts(module: Any, mats: list[Any], biases: list[Any] | None, owned: bool) -> None:
    bias = torch.cat(biases) if biases else None
    if len({m[0].dtype for m in mats if isinstance(m, tuple)}) > 1:
        # int4 parts beside int8 ones (q|k 4-bit, v 6-bit): all int8 groups, one kernel per layer
        mats = [_int4_to_int8(m) if m[0].dtype == torch.uint8 else m for m in mats]
    owned = owned or len(mats) > 1
    if isinstance(mats[0], tuple):
        weight = torch.cat([m[0] for m in mats]) if len(mats) > 1 else mats[0][0]
        scale = torch.cat([m[1] for m in mats]) if len(mats) > 1 else mats[0][1]
        module.load(weight, scale=scale, bias=bias, owned=owned)
    else:
        module.load(torch.cat(mats) if len(mats) > 1 else mats[0], bias=bias)


def _int4_to_int8(mat: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """int4 codes and groups -> the same weights as int8 groups (w = s (q - 8) + z: codes q - 8)."""
    codes, scale_zero = mat
    return unpack_int4_codes(codes).to(torch.int8) - 8, scale_zero.to(torch.float16)


def load_model(
    model: str,
    *,
    device: torch.device,
    dtype: torch.dtype,
    max_position: int | None = None,
    quantization: str = "none",
    weight_cache: bool | None = None,
    check: Callable[[Any], None] | None = None,
) -> LoadedModel:
    """Load ``model`` (catalog id, .gguf, HF folder), converted to ``dtype``/``quantization``.
    ``check`` is called with the model's config before any weight is converted (from a GGUF:
    before any is read), so settings that cannot fit the model fail at once, not after the load.

    A GGUF converted to int8 or int4 on the CPU is kept in the weight cache (``weight_cache``; default on
    unless ``HYBRIDLLM_ENGINE_WEIGHT_CACHE=0``), so later starts read it instead of converting.
    """
    name, path = resolve_model_path(model)
    tensors: Any
    origin: Callable[[str], str]  # the file a tensor came from
    if path.is_dir():
        from .loader_safetensors import load_safetensors_folder
        from .tokenizer import HFTokenizer

        # the tokenizer first: a folder without tokenizer.json fails before its weights are read
        tokenizer: Any = HFTokenizer(path)
        origins: dict[str, str] = {}  # tensor -> its file, named in the errors of its weights
        config, tensors = load_safetensors_folder(path, origins)
        origin = lambda name: origins.get(name, str(path))  # noqa: E731
        if check is not None:
            check(config)
        cached, weights = None, None
    else:
        from .loader_gguf import iter_gguf_tensors, open_gguf
        from .tokenizer import GGUFTokenizer
        from .weight_cache import WeightCache

        config, gguf_file, _ = open_gguf(path)
        if check is not None:
            check(config)
        tokenizer = GGUFTokenizer(path)
        cached = WeightCache.for_model(path, device=device, dtype=dtype, quantization=quantization,
                                       enabled=weight_cache)
        weights = cached.read() if cached is not None else None
        if weights is None:
            tensors = iter_gguf_tensors(gguf_file, config, quantization=quantization)
        origin = lambda _name: f"GGUF file {path}"  # noqa: E731
    max_pos = min(max_position or config.max_position_embeddings, config.max_position_embeddings)
    if weights is None:
        weights = convert_weights(tensors, device=device, dtype=dtype, quantization=quantization,
                                  origin=origin)
        del tensors
        if cached is not None:
            cached.write(weights)
    try:
        net = assemble_model(config, weights, device=device, dtype=dtype, max_position=max_pos, consume=True)
    except ModelLoadError as exc:  # weights that do not fit the model: say whose
        raise ModelLoadError(f"{path}: {exc}") from exc
    del weights
    _return_freed_memory()
    return LoadedModel(name=name, config=config, model=net, tokenizer=tokenizer)


def _return_freed_memory() -> None:
    """Hand the loader's freed scratch memory back to the OS (glibc keeps it otherwise)."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass
