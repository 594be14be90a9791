"""Write a Hugging Face folder from a GGUF file (config.json, model.safetensors, tokenizer).

Lets the safetensors loader be tested offline on real weights, and turns a GGUF into the layout
production loads (and ONNX Runtime GenAI's model builder reads). Supports the Llama family and
Qwen2 with a GPT-2-style byte-level BPE vocabulary (SmolLM2, Qwen2.5).
"""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from hybridllm.models.gguf_header import read_gguf_header

from ..exceptions import ModelLoadError
from .loader_gguf import load_gguf

_CONTROL = 3  # llama.cpp token type of special (control) tokens
# llama.cpp token type of user-defined tokens: the original tokenizer's added tokens that were not
# flagged special (Qwen2.5's <tool_call>, </tool_call>), which the merges never build
_USER_DEFINED = 4
# Qwen2's pre-tokenizer split (llama.cpp's "qwen2" pre-tokenizer; byte-level BPE after it)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _tokenizer_json(meta: dict[str, Any], out: Path) -> None:
    """tokenizer.json from the GGUF's metadata (``read_gguf_header``'s: lists of str and int)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    types = meta["tokenizer.ggml.token_type"]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    if meta.get("tokenizer.ggml.pre") == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:  # llama.cpp's "smollm" pre-tokenizer: single digits, then GPT-2's byte-level split
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False)
         for t, kind in zip(tokens, types, strict=True) if kind == _CONTROL]
    )
    # user-defined tokens stay added tokens, unflagged as in the original tokenizer.json: without
    # them the template's own <tool_call> became 5 plain ids here but 1 id on the GGUF (and a raw
    # prompt's too). A message's text still reads them as characters (prompts.tokenizers_plain).
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False)
         for t, kind in zip(tokens, types, strict=True) if kind == _USER_DEFINED]
    )
    tok.save(str(out / "tokenizer.json"))


def gguf_to_hf_folder(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """``out_dir`` must be new or empty: the folder is written beside it and moved into place
    whole, so a failed export leaves nothing, and no old file (another model's shards, which the
    loader would read too) is mixed with the new ones."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelLoadError(f"{out} already exists and is not an empty folder; export into a new one")
    config, tensors, meta = load_gguf(gguf_path)
    arch = meta.get("general.architecture")
    if arch not in ("llama", "qwen2") or meta.get("tokenizer.ggml.model") != "gpt2":
        raise ModelLoadError("gguf_to_hf_folder supports Llama and Qwen2 models with a GPT-2 BPE vocabulary")
    rope_scaling = _rope_scaling(gguf_path, config, meta, arch)
    out.parent.mkdir(parents=True, exist_ok=True)
    # made with the umask's permissions (mkdtemp's 0700 would have stayed on the exported folder)
    work = out.parent / f".{out.name}.{secrets.token_hex(4)}.partial"
    work.mkdir()
    try:
        _write_folder(gguf_path, work, config, tensors, meta, arch, rope_scaling)
        if out.exists():
            out.rmdir()  # empty, checked above
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out


def _rope_scaling(gguf_path: str | Path, config: Any, meta: dict, arch: str) -> dict | None:
    """config.json's ``rope_scaling`` for the GGUF's RoPE scaling (it was dropped: the exported
    model ran its long positions unscaled). One that no HF rope_scaling spells is refused."""
    scaling = config.rope_scaling  # load_gguf's: linear (from the metadata), or rope_freqs' factors
    if scaling is None:
        kind = meta.get(f"{arch}.rope.scaling.type", "none")
        factor = meta.get(f"{arch}.rope.scaling.factor")
        if kind not in ("none", "linear") and factor and float(factor) != 1.0:  # yarn, longrope
            raise ModelLoadError(f"{gguf_path}: its RoPE scaling {kind!r} (factor {factor}) cannot "
                                 "be exported; convert the original Hugging Face folder instead")
        return None
    if scaling.get("rope_type") == "linear":
        return {"rope_type": "linear", "factor": scaling["factor"]}
    if all(f == 1.0 for f in scaling.get("factors", ())):  # rope_freqs of ones: no scaling
        return None
    # Llama 3.x: llama.cpp stores only the per-frequency divisors its converter computed from
    # config.json's rope_scaling (factor, low/high_freq_factor, original_max_position_embeddings),
    # not those parameters, and no standard HF rope_type takes the divisors themselves
    raise ModelLoadError(f"{gguf_path}: its RoPE scaling is a rope_freqs tensor (Llama 3.x), which "
                         "a config.json cannot express without the llama3 parameters the GGUF lacks; "
                         "use the original Hugging Face folder instead")


def _write_folder(gguf_path: str | Path, out: Path, config: Any, tensors: dict, meta: dict,
                  arch: str, rope_scaling: dict | None = None) -> None:
    from safetensors.numpy import save_file

    hf_config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": int(meta.get("tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(meta.get("tokenizer.ggml.eos_token_id", 2)),
        "torch_dtype": "float32",
    }
    if rope_scaling:
        hf_config["rope_scaling"] = rope_scaling
    if arch == "qwen2":  # Llama's layout with q/k/v biases (loaded under the same names)
        hf_config.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                         use_sliding_window=False, max_window_layers=config.num_layers)
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              str(out / "model.safetensors"))
    write_tokenizer(gguf_path, out)


def write_tokenizer(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """The tokenizer files of :func:`gguf_to_hf_folder` alone (tokenizer.json and
    tokenizer_config.json, from the GGUF's header: a fraction of a second where ``GGUFReader``
    took 4 s for SmolLM2 and more for Qwen2.5, parsing each token with numpy)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = read_gguf_header(gguf_path).metadata  # values as GGUFReader's field.contents() gives
    _tokenizer_json(meta, out)
    tokens = meta["tokenizer.ggml.tokens"]
    tok_config = {
        "bos_token": tokens[int(meta.get("tokenizer.ggml.bos_token_id", 1))],
        "eos_token": tokens[int(meta.get("tokenizer.ggml.eos_token_id", 2))],
        "add_bos_token": str(meta.get("tokenizer.ggml.add_bos_token", False)).lower() == "true",
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    return out
