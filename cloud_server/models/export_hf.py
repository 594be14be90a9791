"""Write a Hugging Face folder from a GGUF file (config.json, model.safetensors, tokenizer).

Lets the safetensors loader be tested offline on real weights, and turns a GGUF into the layout
production loads (and ONNX Runtime GenAI's model builder reads). Supports the Llama family and
Qwen2 with a GPT-2-style byte-level BPE vocabulary (SmolLM2, Qwen2.5).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..exceptions import ModelLoadError
from .loader_gguf import load_gguf

_CONTROL = 3  # llama.cpp token type of special (control) tokens
# Qwen2's pre-tokenizer split (llama.cpp's "qwen2" pre-tokenizer; byte-level BPE after it)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _tokenizer_json(reader_fields: dict, out: Path) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokens = reader_fields["tokenizer.ggml.tokens"].contents()
    merges = [tuple(m.split(" ", 1)) for m in reader_fields["tokenizer.ggml.merges"].contents()]
    types = reader_fields["tokenizer.ggml.token_type"].contents()
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    if reader_fields.get("tokenizer.ggml.pre") is not None and \
            reader_fields["tokenizer.ggml.pre"].contents() == "qwen2":
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
    tok.save(str(out / "tokenizer.json"))


def gguf_to_hf_folder(gguf_path: str | Path, out_dir: str | Path) -> Path:
    import gguf
    from safetensors.numpy import save_file

    config, tensors, meta = load_gguf(gguf_path)
    arch = meta.get("general.architecture")
    if arch not in ("llama", "qwen2") or meta.get("tokenizer.ggml.model") != "gpt2":
        raise ModelLoadError("gguf_to_hf_folder supports Llama and Qwen2 models with a GPT-2 BPE vocabulary")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
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
    if arch == "qwen2":  # Llama's layout with q/k/v biases (loaded under the same names)
        hf_config.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                         use_sliding_window=False, max_window_layers=config.num_layers)
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()},
              str(out / "model.safetensors"))
    reader = gguf.GGUFReader(str(gguf_path))
    _tokenizer_json(reader.fields, out)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    tok_config = {
        "bos_token": tokens[hf_config["bos_token_id"]],
        "eos_token": tokens[hf_config["eos_token_id"]],
        "add_bos_token": str(meta.get("tokenizer.ggml.add_bos_token", False)).lower() == "true",
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    return out
