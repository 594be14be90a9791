"""What a model's header says, read without its weights: the start-up checks of ``hybridllm-cloud
serve`` (context length, the draft's tokenizer) before anything loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hybridllm.models.gguf_header import read_gguf_metadata

from .config import ModelConfig


@dataclass
class ModelHeader:
    """What a model's header says, read without its weights (start-up checks): its config as the
    loader makes it, and ``eos_token_ids`` and ``tokens`` (its id count) as the GGUF tokenizer takes
    them (``None`` for a folder: its tokenizer files say them, and its ``vocab_size`` counts the
    embedding's rows, which checkpoints pad: Qwen2.5's 151,936 rows for 151,665 ids)."""

    config: ModelConfig
    eos_token_ids: frozenset[int] | None
    tokens: int | None = None


def read_model_header(model: str) -> ModelHeader | None:
    """The header of ``model`` (a .gguf file, a Hugging Face folder or a catalog id already pulled)
    as the loader will read it, or None where it cannot be read here: a catalog model not pulled
    yet, a damaged file (the load says what is wrong)."""
    import json

    path = Path(model).expanduser()
    if path.suffix != ".gguf" and not path.is_dir():
        try:
            from hybridllm.models import store
            from hybridllm.models.catalog import get_spec

            spec = get_spec(model)
            if spec.kind != "gguf" or store.pull_state(model) == store.ABSENT:
                return None
            path = store.model_dir(spec) / spec.main_file.name
        except Exception:  # noqa: BLE001 - not a catalog id: checked elsewhere
            return None
    try:
        if path.is_dir():
            from .loader_safetensors import config_from_hf

            config = config_from_hf(json.loads((path / "config.json").read_text(encoding="utf-8")))
            return ModelHeader(config, None, None)
        from .loader_gguf import config_from_metadata

        meta = read_gguf_metadata(path)  # arrays as their lengths: the token count
        config = config_from_metadata(meta, int(meta["tokenizer.ggml.tokens"]))
        eos = None
        if "tokenizer.ggml.eos_token_id" in meta:  # as the GGUF tokenizer takes them
            keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                    "tokenizer.ggml.eom_token_id")
            eos = frozenset(int(meta[k]) for k in keys
                            if k in meta and 0 <= int(meta[k]) < config.vocab_size)
        return ModelHeader(config, eos, int(meta["tokenizer.ggml.tokens"]))
    except Exception:  # noqa: BLE001 - unreadable here: the load reports it
        return None
