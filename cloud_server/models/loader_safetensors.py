"""Load a Hugging Face folder: ``config.json`` + ``*.safetensors`` (how production loads models)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..exceptions import ModelLoadError
from .config import ModelConfig, gemma3_layer_types
from .tokenizer import read_json_object

_LLAMA_TYPES = {"llama", "mistral", "qwen2", "smollm", "smollm2"}
_GEMMA3_TYPES = {"gemma3", "gemma3_text"}


_MISSING = object()


def _number(raw: dict[str, Any], key: str, kind: type = int, default: Any = _MISSING) -> Any:
    """config.json's positive ``key`` as ``kind``; absent or null: ``default``. A missing required
    field or a value of the wrong type is a ModelLoadError naming the field (not a KeyError)."""
    value = raw.get(key)
    if value is None:
        if default is _MISSING:
            raise ModelLoadError(f"config.json has no {key!r}")
        return default
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if not ok or (kind is int and not float(value).is_integer()):
        what = "a positive integer" if kind is int else "a positive number"
        raise ModelLoadError(f"config.json: {key!r} must be {what}, got {value!r}")
    return kind(value)


def _flag(raw: dict[str, Any], key: str, default: bool) -> bool:
    """A true/false field (null or absent: ``default``); "false" as a string was read as true."""
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelLoadError(f"config.json: {key!r} must be true or false, got {value!r}")
    return value


def config_from_hf(raw: dict[str, Any]) -> ModelConfig:
    if not isinstance(raw, dict):
        raise ModelLoadError(f"config.json must hold a JSON object, got {type(raw).__name__}")
    model_type = raw.get("model_type", "")
    if model_type == "gemma3" and "text_config" in raw:
        if not isinstance(raw["text_config"], dict):
            raise ModelLoadError("config.json: 'text_config' must be a JSON object")
        raw = {**raw["text_config"], "model_type": "gemma3_text"}
        model_type = "gemma3_text"
    if model_type not in _LLAMA_TYPES | _GEMMA3_TYPES:
        supported = ", ".join(sorted(_LLAMA_TYPES | _GEMMA3_TYPES))
        raise ModelLoadError(f"unsupported model_type {model_type!r} in config.json; supported: {supported}")
    quant = raw.get("quantization_config")
    if quant:  # GPTQ/AWQ/FP8 tensors would be read as plain floats (or fail on their scales)
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
        raise ModelLoadError(
            f"config.json: pre-quantized checkpoints (quantization_config: {method!r}) are not "
            "supported; load the fp16/bf16 model (quantization='int8' or 'int4' quantizes it here)"
        )
    hidden, num_heads = _number(raw, "hidden_size"), _number(raw, "num_attention_heads")
    head_dim = _number(raw, "head_dim", default=None)
    if head_dim is None:  # HF's default, which only holds when the heads divide hidden_size
        if hidden % num_heads:
            raise ModelLoadError(
                f"config.json: hidden_size {hidden} is not a multiple of num_attention_heads "
                f"{num_heads}, and no head_dim is given"
            )
        head_dim = hidden // num_heads
    common: dict[str, Any] = dict(
        vocab_size=_number(raw, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_number(raw, "intermediate_size"),
        num_layers=_number(raw, "num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=_number(raw, "num_key_value_heads", default=num_heads),
        head_dim=head_dim,
        rms_norm_eps=_number(raw, "rms_norm_eps", float, 1e-6),
        rope_theta=_number(raw, "rope_theta", float, 10000.0),
        rope_scaling=raw.get("rope_scaling"),
        max_position_embeddings=_number(raw, "max_position_embeddings", default=4096),
        tie_word_embeddings=_flag(raw, "tie_word_embeddings", False),
    )
    if model_type in _LLAMA_TYPES:
        bias = _flag(raw, "attention_bias", model_type == "qwen2")
        return ModelConfig(architecture="llama", attention_bias=bias, **common)
    if model_type in _GEMMA3_TYPES:
        n = common["num_layers"]
        common["tie_word_embeddings"] = True
        if not isinstance(raw.get("layer_types") or [], list):  # list(6) was a bare TypeError
            raise ModelLoadError(f"config.json: 'layer_types' must be a list, got {raw['layer_types']!r}")
        return ModelConfig(
            architecture="gemma3",
            rope_local_theta=_number(raw, "rope_local_base_freq", float, 10000.0),
            sliding_window=_number(raw, "sliding_window", default=512),
            layer_types=list(raw.get("layer_types") or gemma3_layer_types(
                n, _number(raw, "sliding_window_pattern", default=6))),
            query_pre_attn_scalar=_number(raw, "query_pre_attn_scalar", float, common["head_dim"]),
            **common,
        )
    raise AssertionError(model_type)  # checked above


_INDEX = "model.safetensors.index.json"
# tensors a checkpoint may hold that the text model has no place for: RoPE tables some trainers
# saved (vLLM skips them too), and a Gemma 3 multimodal checkpoint's vision tower
_SKIPPED = (".rotary_emb.inv_freq", "vision_tower.", "multi_modal_projector.")


def _expected_shapes(c: ModelConfig) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """(required, optional) tensor name -> shape, as config.json sizes them: a tensor missing (a
    norm kept its initial ones), of another shape or unknown is named with its file up front."""
    h, q, kv = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    need: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h),
                                        "model.norm.weight": (h,)}
    optional: dict[str, tuple[int, ...]] = {"lm_head.weight": (c.vocab_size, h)}
    norms = ["input_layernorm", "post_attention_layernorm"]
    if c.architecture == "gemma3":
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        need.update({f"{p}{n}.weight": (h,) for n in norms})
        need.update({f"{p}self_attn.q_proj.weight": (q, h), f"{p}self_attn.k_proj.weight": (kv, h),
                     f"{p}self_attn.v_proj.weight": (kv, h), f"{p}self_attn.o_proj.weight": (h, q),
                     f"{p}mlp.gate_proj.weight": (c.intermediate_size, h),
                     f"{p}mlp.up_proj.weight": (c.intermediate_size, h),
                     f"{p}mlp.down_proj.weight": (h, c.intermediate_size)})
        if c.architecture == "gemma3":
            need.update({f"{p}self_attn.q_norm.weight": (c.head_dim,),
                         f"{p}self_attn.k_norm.weight": (c.head_dim,)})
        optional.update({f"{p}self_attn.q_proj.bias": (q,), f"{p}self_attn.k_proj.bias": (kv,),
                         f"{p}self_attn.v_proj.bias": (kv,)})
    return need, optional


def _shard_files(folder: Path) -> tuple[list[Path], dict[str, str]]:
    """The safetensors files to read and, from a sharded model's index, tensor -> shard name.
    With an index only the shards it names are read (a Mistral folder also holds
    consolidated.safetensors, the same weights under other names), and each must be there."""
    index_path = folder / _INDEX
    if not index_path.is_file():
        return sorted(folder.glob("*.safetensors")), {}
    index = read_json_object(index_path)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"{index_path} has no 'weight_map'")
    for s in weight_map.values():  # "../x" or "/abs/x" would read a file outside the folder
        if not isinstance(s, str) or s in ("", ".", "..") or any(c in s for c in "/\\\0"):
            raise ModelLoadError(f"{index_path} names the shard {s!r}: shards must be plain file "
                                 f"names in {folder}")
    shards = sorted(set(weight_map.values()))
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise ModelLoadError(f"{index_path} names shards that are not in {folder}: {missing}")
    return [folder / s for s in shards], weight_map


def load_safetensors_folder(
    folder: str | Path, origins: dict[str, str] | None = None
) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Returns (config, HF-named tensors in the engine's conventions); ``origins``, if given, is
    filled with each tensor's file (for errors about its weights)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(f"{folder} has no config.json")
    raw = read_json_object(cfg_path)
    try:
        config = config_from_hf(raw)
    except ModelLoadError as exc:  # say which folder's config.json
        raise ModelLoadError(f"{cfg_path}: {exc}") from None
    # as written (absent: tie when the files hold no head; Gemma 3 is always tied)
    raw_tie = raw.get("tie_word_embeddings") if config.architecture == "llama" else None
    files, weight_map = _shard_files(folder)
    if not files:
        raise ModelLoadError(f"{folder} has no *.safetensors files")
    need, optional = _expected_shapes(config)
    tensors: dict[str, torch.Tensor] = {}
    source: dict[str, str] = {}  # tensor -> the file it came from
    found: set[str] = set()  # names as the files spell them
    for f in files:
        try:
            loaded = load_file(str(f))
        except Exception as exc:  # safetensors' own error on a file cut short or damaged
            raise ModelLoadError(
                f"cannot read {f}: it is truncated or damaged ({type(exc).__name__}: {exc}); "
                "download it again (an interrupted copy leaves such a file)"
            ) from exc
        for name, t in loaded.items():
            if weight_map and weight_map.get(name) != f.name:
                continue  # the index puts it elsewhere (or nowhere)
            found.add(name)
            name = name.replace("language_model.model.", "model.").replace(
                "model.language_model.", "model.")
            if name.startswith("language_model.lm_head."):  # older Gemma 3 checkpoints' head
                name = name[len("language_model."):]  # transformers maps it to lm_head too
            if any(part in name for part in _SKIPPED):
                continue
            if not t.is_floating_point() or t.element_size() < 2:  # ints, bools, fp8: not weights
                raise ModelLoadError(f"{f}: tensor {name} has dtype {t.dtype}; expected float32, "
                                     "float16 or bfloat16")
            shape = need.get(name) or optional.get(name)
            if shape is None:
                raise ModelLoadError(f"{f}: unexpected tensor {name} (not part of the "
                                     f"{config.architecture} layout config.json describes)")
            if tuple(t.shape) != shape:
                raise ModelLoadError(f"{f}: tensor {name} has shape {tuple(t.shape)}; config.json "
                                     f"makes it {shape}")
            if name in tensors:  # two files with one tensor: a folder mixing two exports
                raise ModelLoadError(
                    f"tensor {name} is in both {source[name]} and {f.name} in {folder}; "
                    "remove the stale file (or add the model's model.safetensors.index.json)"
                )
            if config.architecture == "gemma3" and name.endswith("norm.weight"):
                t = t.float() + 1.0  # HF Gemma stores w; the engine multiplies by (1 + w)
            tensors[name] = t
            source[name] = f.name
        del loaded
    absent = sorted(set(weight_map) - found)
    if absent:
        raise ModelLoadError(f"{folder / _INDEX} names tensors its shards lack: {absent[:5]}")
    missing = [n for n in need if n not in tensors]
    if missing:
        raise ModelLoadError(f"{folder}: no safetensors file holds {missing[:5]}"
                             + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""))
    if "lm_head.weight" not in tensors:
        if raw_tie is False:  # an untied head the files lack: tying it would give wrong logits
            raise ModelLoadError(f"{folder}: config.json says tie_word_embeddings false, but no "
                                 "safetensors file holds lm_head.weight")
        config.tie_word_embeddings = True
    elif config.tie_word_embeddings:
        tensors.pop("lm_head.weight")
    if origins is not None:
        origins.update({name: str(folder / source[name]) for name in tensors})
    return config, tensors
