"""Load a GGUF file into a ModelConfig and a Hugging Face-named fp32 state dict.

Weights are dequantized one tensor at a time (``iter_gguf_tensors``), so a loader can convert
each to its final form before the next is read. Layout differences from Hugging Face:
- llama.cpp's converter permutes Llama's q/k rows so its interleaved-pair RoPE works; we undo it
  so that every model here uses HF's rotate-half RoPE and HF tensor layouts. Qwen2 files are not
  permuted (llama.cpp runs them with rotate-half RoPE), and become the Llama architecture with
  q/k/v biases.
- Gemma norms in GGUF already hold ``1 + w``: exactly the engine's convention, kept as is.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hybridllm.models.gguf_header import GGUFTensorEntry, read_gguf_header

from ..exceptions import ModelLoadError
from .config import ModelConfig, gemma3_layer_types
from .dequant import INT4_TYPES, INT8_GROUP_TYPES, dequantize_fast_torch, int4_groups, int8_groups

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
}
# The norm after attention is the pre-MLP norm in Llama but its own norm in Gemma 3.
_ARCH_LAYER_NAMES = {
    "llama": {"ffn_norm": "post_attention_layernorm"},
    "qwen2": {"ffn_norm": "post_attention_layernorm"},
    "gemma3": {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
}


# The vocabulary's arrays: left unread (the tokenizer reads them), their lengths kept
_VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                 "tokenizer.ggml.merges")
# Types stored as plain numpy arrays; every other (block formats, BF16) is stored as bytes
_PLAIN_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8,
                 "I16": np.int16, "I32": np.int32, "I64": np.int64}


def config_from_metadata(meta: dict[str, Any], num_vocab_tokens: int) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in _ARCH_LAYER_NAMES:
        raise ModelLoadError(f"GGUF architecture {arch!r} is not supported ({', '.join(_ARCH_LAYER_NAMES)})")

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    def need(key: str) -> Any:  # a size the model cannot be built without
        if get(key) is None:
            raise ModelLoadError(f"its metadata lacks {arch}.{key}: the file is incomplete")
        return get(key)

    # A value of the wrong type (a string or a per-layer array where one number belongs, a size of
    # 0) was a bare ValueError, TypeError or ZeroDivisionError out of the loader: named here.
    def size(key: str, default: Any = None) -> int:
        value = need(key) if default is None else get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelLoadError(
                f"its metadata's {arch}.{key} must be a positive whole number, got {value!r}")
        return value

    def number(key: str, default: float | None) -> float | None:
        value = get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ModelLoadError(f"its metadata's {arch}.{key} must be a number, got {value!r}")
        return float(value)

    experts = get("expert_count")
    if experts not in (None, 0, 1):  # Mixtral's GGUFs say "llama": expert tensors, no ffn_gate
        raise ModelLoadError(f"its metadata's {arch}.expert_count is {experts!r}: mixture-of-experts "
                             "models are not supported")
    hidden = size("embedding_length")
    num_heads = size("attention.head_count")
    num_layers = size("block_count")
    head_dim = size("attention.key_length", hidden // num_heads)
    rot = get("rope.dimension_count")
    if rot is not None and rot != head_dim:  # llama.cpp rotates only the first rot dims of a head
        raise ModelLoadError(f"its metadata's {arch}.rope.dimension_count ({rot!r}) is not the head size "
                             f"({head_dim}): partial RoPE is not supported")
    # llama.cpp reads the type as linear where a file gives only a factor (or the older
    # rope.scale_linear), and never scales with type "none". Any other type (yarn, longrope) is
    # refused, as the Hugging Face loader refuses it: run as plain RoPE it gave wrong answers.
    kind = get("rope.scaling.type", "linear")
    factor = number("rope.scaling.factor", None) or number("rope.scale_linear", None)
    if kind not in ("linear", "none"):
        raise ModelLoadError(
            f"its metadata's {arch}.rope.scaling.type {kind!r} is not supported (linear, none)")
    scaling = None
    if kind == "linear" and factor and factor != 1.0:
        scaling = {"rope_type": "linear", "factor": factor}
    cfg: dict[str, Any] = dict(
        architecture="llama" if arch == "qwen2" else arch,
        attention_bias=arch == "qwen2",
        vocab_size=size("vocab_size", num_vocab_tokens),
        hidden_size=hidden,
        intermediate_size=size("feed_forward_length"),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=size("attention.head_count_kv", num_heads),
        head_dim=head_dim,
        rms_norm_eps=number("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=number("rope.freq_base", 10000.0),
        rope_scaling=scaling,
        max_position_embeddings=size("context_length", 4096),
    )
    if arch == "gemma3":
        cfg.update(
            tie_word_embeddings=True,
            rope_local_theta=10000.0,
            sliding_window=size("attention.sliding_window", 512),
            layer_types=gemma3_layer_types(num_layers),
            # llama.cpp scales queries by 1/sqrt(head_dim) for every size but 27B.
            query_pre_attn_scalar=float(head_dim),
        )
    return ModelConfig(**cfg)


def unpermute_qk(w: Any, num_heads: int) -> Any:
    """Undo llama.cpp's ``reshape(h, 2, d/2, in).swapaxes(1, 2)`` on q/k rows (numpy or torch)."""
    out_dim, in_dim = w.shape  # [num_heads * head_dim, hidden]
    head_dim = out_dim // num_heads
    return w.reshape(num_heads, head_dim // 2, 2, in_dim).swapaxes(1, 2).reshape(out_dim, in_dim)


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies in the file (what loading needs; the reader itself is dropped)."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    data_offset: int
    n_bytes: int
    n_elements: int
    shape: tuple[int, ...]  # as stored: [rows, row bytes] for block formats
    dtype: Any  # numpy dtype of the stored array


@dataclass
class GGUFTensors:
    path: str
    architecture: str
    tensors: list[TensorInfo]


class UnknownTensorType(ValueError):
    """A tensor of a type the gguf package does not know (newer than it)."""


def read_gguf(path: str | Path) -> tuple[dict[str, Any], int | None, list[TensorInfo]]:
    """(metadata without the vocabulary arrays, the vocabulary's token count or None, tensor
    locations), from the header alone: 0.1 s for a 151k-token vocabulary where ``GGUFReader``
    took 13 s. ValueError on a damaged file (UnknownTensorType for a type unknown here), OSError
    on one that cannot be read."""
    header = read_gguf_header(path, skip=_VOCAB_ARRAYS)
    infos = [_tensor_info(path, t, header.file_size) for t in header.tensors]
    return header.metadata, header.array_lengths.get("tokenizer.ggml.tokens"), infos


def _tensor_info(path: str | Path, t: GGUFTensorEntry, file_size: int) -> TensorInfo:
    """A table row as GGUFReader reads it: numpy shape reversed from GGUF's, a block format's
    last dimension in bytes; its data must lie inside the file."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        kind = GGMLQuantizationType(t.type_id)
        block, size = GGML_QUANT_SIZES[kind]
    except (ValueError, KeyError):
        raise UnknownTensorType(f"tensor {t.name} is of type {t.type_id}, which the gguf "
                                "package does not know") from None
    shape = tuple(reversed(t.dims))
    dtype = _PLAIN_DTYPES.get(kind.name)
    if dtype is None:
        if not shape or shape[-1] % block:
            raise ValueError(f"tensor {t.name}'s shape {list(shape)} is not whole {kind.name} blocks")
        dtype, shape = np.uint8, (*shape[:-1], shape[-1] // block * size)
    n_bytes = t.n_elements * size // block
    if t.data_offset + n_bytes > file_size:
        raise ValueError(f"{path}: tensor {t.name}'s {n_bytes} bytes at offset {t.data_offset} run "
                         f"past the end of the file ({file_size} bytes)")
    return TensorInfo(t.name, kind, t.data_offset, n_bytes, t.n_elements, shape, np.dtype(dtype))


def open_gguf(path: str | Path) -> tuple[ModelConfig, GGUFTensors, dict[str, Any]]:
    """Returns (config, tensor locations, metadata without the vocabulary arrays)."""
    try:
        import gguf  # noqa: F401  (its type constants name the tensors' types)
    except ImportError as exc:  # pragma: no cover - server extra missing
        raise ModelLoadError("loading GGUF needs the 'gguf' package (hybridllm[server])") from exc
    try:
        meta, num_tokens, infos = read_gguf(path)
    except OSError as exc:
        raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc
    except UnknownTensorType as exc:  # a tensor type newer than the gguf package
        raise ModelLoadError(
            f"GGUF file {path} holds tensors of a type this server cannot read ({exc}); pick a "
            "GGUF of a common type (Q4_K_M, Q8_0, F16) or upgrade the gguf package"
        ) from exc
    except ValueError as exc:  # a file cut short or damaged (gguf_header names the offset)
        raise ModelLoadError(
            f"cannot read GGUF file {path}: it is truncated or damaged ({type(exc).__name__}: {exc}); "
            "copy or download it again (a catalog model: `hybridllm models pull ID --force`)"
        ) from exc
    if num_tokens is None:
        raise ModelLoadError(f"GGUF file {path} has no tokenizer (tokenizer.ggml.tokens)")
    try:
        config = config_from_metadata(meta, num_tokens)
    except ModelLoadError as exc:
        raise ModelLoadError(f"GGUF file {path}: {exc}") from None
    if not any(t.name == "output.weight" for t in infos):
        config.tie_word_embeddings = True
    return config, GGUFTensors(str(path), str(meta["general.architecture"]), infos), meta


_CHUNK_ELEMENTS = 1 << 22  # weights dequantized at a time: 16 MB of fp32 (and its scratch)


def _read_raw(path: str, t: TensorInfo) -> np.ndarray:
    """The tensor's bytes, read from the file into ordinary memory.

    Reading through the reader's memory map would leave every page of the file resident in
    this process (counted in its RSS) for as long as the map lives.
    """
    with open(path, "rb") as f:
        f.seek(t.data_offset)
        buf = f.read(t.n_bytes)
    return np.frombuffer(buf, dtype=t.dtype).reshape(t.shape)


def _dequantize_raw(raw: np.ndarray, tensor_type: Any) -> Any:  # torch fp32
    import torch
    from gguf.quants import dequantize

    out = dequantize_fast_torch(raw, tensor_type.name)
    if out is None:
        arr = np.asarray(dequantize(raw, tensor_type), dtype=np.float32)
        out = torch.from_numpy(arr.copy() if not arr.flags.writeable else arr)
    return out


@dataclass
class RowChunks:
    """A large matrix, dequantized a band of rows at a time (iterate: fp32 [rows_i, cols]).

    ``kind="int4"`` (a 4-bit type): the bands are not widened: each is (codes uint8
    [rows_i, cols / 2] two per byte, scale_zero fp32 [rows_i, cols / 32, 2]), the int4 format of
    ``layers.linear``. ``kind="int8"`` (a type of ``INT8_GROUP_TYPES``): each is (codes int8
    [rows_i, cols], scale_zero fp16 [rows_i, cols / 32, 2]), its grouped int8 format.
    """

    raw: np.ndarray  # [rows, row bytes] as stored
    tensor_type: Any
    rows_per_chunk: int
    kind: str = "float"

    def __iter__(self) -> Iterator[Any]:
        import torch

        from ..layers.linear import pack_int4_codes

        for i in range(0, self.raw.shape[0], self.rows_per_chunk):
            band = self.raw[i : i + self.rows_per_chunk]
            if self.kind == "int4":
                q, scale, zero = int4_groups(band, self.tensor_type.name)
                yield pack_int4_codes(q), torch.stack((scale, zero), dim=-1)
            elif self.kind == "int8":
                q, scale, zero = int8_groups(band, self.tensor_type.name)
                yield q, torch.stack((scale, zero), dim=-1).to(torch.float16)
            else:
                yield _dequantize_raw(band, self.tensor_type)


def is_quantized(name: str) -> bool:
    """Whether a quantizing load quantizes the tensor of this HF name: the matrices and the
    embedding table (norms and biases stay in the activation dtype)."""
    return name.endswith("_proj.weight") or name in ("lm_head.weight", "model.embed_tokens.weight")


def iter_gguf_tensors(
    gguf_file: GGUFTensors, config: ModelConfig, *, quantization: str = "none"
) -> Iterator[tuple[str, Any]]:
    """Yield (HF name, fp32 torch tensor or ``RowChunks``) one at a time.

    Sets RoPE scaling from rope_freqs. Matrices beyond 64 MB of fp32 (embeddings, the output
    head) come as ``RowChunks`` so that a loader can convert them band by band. Matrices of a
    type made of blocks of 32 (Q8_0, Q5_0 and the 4-bit types) are never widened where they are
    to be quantized: with ``quantization="int4"`` the 4-bit types (Q4_0, Q4_1, Q4_K) that the int4
    format takes come as int4 ``RowChunks`` (their own codes and groups), and with ``"int8"`` or
    ``"int4"`` the others come as int8 ``RowChunks`` (their codes and blocks as int8 groups).
    """
    arch, path = gguf_file.architecture, gguf_file.path
    names = {**_LAYER_NAMES, **_ARCH_LAYER_NAMES[arch]}
    for t in gguf_file.tensors:
        if t.name == "rope_freqs.weight":  # Llama 3.1 RoPE scaling, as per-pair divisors
            factors = _read_tensor(path, t, _dequantize_raw, t.tensor_type)
            config.rope_scaling = {"rope_type": "freq_factors", "factors": factors.flatten().tolist()}
            continue
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output.weight":
            name = "lm_head.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif t.name.startswith("blk."):
            parts = t.name.split(".", 3)
            if len(parts) < 4 or parts[2] not in names:
                continue
            _, layer, base, kind = parts
            name = f"model.layers.{layer}.{names[base]}.{kind}"
        else:
            continue
        yield name, _read_tensor(path, t, _convert, t, name, arch, config, quantization)


def _read_tensor(path: str, t: TensorInfo, convert: Any, *args: Any) -> Any:
    """``convert(raw, *args)`` of the tensor's bytes ``raw``; a tensor that cannot be read as
    stored (a type this server does not know, a shape its heads do not divide) is a ModelLoadError
    naming the file and the tensor."""
    try:
        return convert(_read_raw(path, t), *args)
    except (ValueError, RuntimeError, NotImplementedError) as exc:
        raise ModelLoadError(
            f"GGUF file {path}: tensor {t.name} ({t.tensor_type.name}, {t.n_elements} weights) "
            f"cannot be read: {exc}"
        ) from exc


def _convert(raw: np.ndarray, t: TensorInfo, name: str, arch: str, config: ModelConfig,
             quantization: str) -> Any:
    """One tensor's stored bytes -> what ``iter_gguf_tensors`` yields for it."""
    from ..layers.linear import int4_supported

    permuted = arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight"))
    heads = config.num_heads if "q_proj" in name else config.num_kv_heads
    if permuted and (raw.ndim != 2 or raw.shape[0] != heads * config.head_dim):
        raise ValueError(f"{heads} heads of {config.head_dim} need {heads * config.head_dim} rows, "
                         f"it has shape {list(raw.shape)}")
    kind = "float"
    if quantization != "none" and raw.ndim == 2 and is_quantized(name):
        cols = t.n_elements // raw.shape[0]
        if (quantization == "int4" and t.tensor_type.name in INT4_TYPES
                and int4_supported(raw.shape[0], cols)):
            kind = "int4"
        elif t.tensor_type.name in INT8_GROUP_TYPES:
            kind = "int8"
    if kind != "float":
        if permuted:  # a permutation of rows: the stored bytes' rows move as they are
            raw = np.ascontiguousarray(unpermute_qk(raw, heads))
        cols = t.n_elements // raw.shape[0]
        return RowChunks(raw, t.tensor_type, max(1, _CHUNK_ELEMENTS // cols), kind=kind)
    if t.n_elements > _CHUNK_ELEMENTS and raw.ndim == 2 and "q_proj" not in name:
        _dequantize_raw(raw[:1], t.tensor_type)  # a type that cannot be read fails here, by name
        cols = t.n_elements // raw.shape[0]
        return RowChunks(raw, t.tensor_type, max(1, _CHUNK_ELEMENTS // cols))
    arr = _dequantize_raw(raw, t.tensor_type)
    return unpermute_qk(arr, heads) if permuted else arr


def load_gguf(path: str | Path) -> tuple[ModelConfig, dict[str, np.ndarray], dict[str, Any]]:
    """Returns (config, HF-named fp32 arrays, GGUF metadata): the whole model in memory."""
    config, gguf_file, meta = open_gguf(path)
    tensors = {}
    for name, t in iter_gguf_tensors(gguf_file, config):
        if isinstance(t, RowChunks):
            import torch

            t = torch.cat(list(t))
        tensors[name] = t.numpy()
    return config, tensors, meta
