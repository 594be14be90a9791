"""Follow-ups on Hugging Face folders: an index's shard names must be plain file names in the
folder (never a path that reads a file elsewhere, never a TypeError), and older Gemma 3
checkpoints' ``language_model.lm_head.weight`` maps to ``lm_head`` as in transformers. Tiny
random models written here; no hub access."""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
from safetensors.torch import save_file

from cloud_server.exceptions import ModelLoadError
from cloud_server.models.loader_safetensors import load_safetensors_folder

from .test_loader_safetensors_review17 import CFG, _build, _tensors


def _indexed(folder, shard_names):
    """A folder whose index maps every tensor to ``shard_names`` (cycled)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CFG))
    names = sorted(_tensors())
    weight_map = {n: shard_names[i % len(shard_names)] for i, n in enumerate(names)}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


@pytest.mark.parametrize("shard", ["../other/model.safetensors", "ABS", "sub/model.safetensors",
                                   "..", ".", "", "..\\other.safetensors"])
def test_a_shard_outside_the_folder_is_refused_unread(tmp_path, monkeypatch, shard):
    other = tmp_path / "other"
    other.mkdir()
    save_file(_tensors(), str(other / "model.safetensors"))
    (tmp_path / "m" / "sub").mkdir(parents=True)
    save_file(_tensors(), str(tmp_path / "m" / "sub" / "model.safetensors"))
    shard = str(other / "model.safetensors") if shard == "ABS" else shard
    folder = _indexed(tmp_path / "m", [shard])
    read = []
    monkeypatch.setattr(safetensors.torch, "load_file", lambda p, *a, **k: read.append(p) or {})
    with pytest.raises(ModelLoadError, match="plain file names") as exc:
        load_safetensors_folder(folder)
    assert "model.safetensors.index.json" in str(exc.value) and repr(shard) in str(exc.value)
    assert read == []  # the file elsewhere was never opened


@pytest.mark.parametrize("shard", [None, 5, ["model.safetensors"], {"f": 1}])
def test_a_shard_name_that_is_not_a_string_is_a_load_error(tmp_path, shard):
    """A TypeError (``folder / None``, an unhashable list) reached the user before."""
    folder = _indexed(tmp_path, ["model-00001-of-00001.safetensors", shard])
    with pytest.raises(ModelLoadError, match="plain file names"):
        load_safetensors_folder(folder)


def test_plain_shard_names_still_load(tmp_path):
    tensors = _tensors()
    names = sorted(tensors)
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for i, shard in enumerate(shards):
        save_file({n: tensors[n] for n in names[i::2]}, str(tmp_path / shard))
    _indexed(tmp_path, shards)
    config, loaded = load_safetensors_folder(tmp_path)
    assert sorted(loaded) == names
    _build(config, loaded)


# Gemma 3 multimodal checkpoints (Gemma3ForConditionalGeneration as first saved)

GEMMA3 = {"model_type": "gemma3", "text_config": {
    "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4}}


def _gemma3_tensors(prefix: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    p = f"{prefix}layers.0."
    shapes = {f"{prefix}embed_tokens.weight": (32, 16), f"{prefix}norm.weight": (16,),
              f"{p}self_attn.q_proj.weight": (16, 16), f"{p}self_attn.k_proj.weight": (8, 16),
              f"{p}self_attn.v_proj.weight": (8, 16), f"{p}self_attn.o_proj.weight": (16, 16),
              f"{p}self_attn.q_norm.weight": (4,), f"{p}self_attn.k_norm.weight": (4,),
              f"{p}mlp.gate_proj.weight": (32, 16), f"{p}mlp.up_proj.weight": (32, 16),
              f"{p}mlp.down_proj.weight": (16, 32)}
    shapes.update({f"{p}{n}.weight": (16,) for n in (
        "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
        "post_feedforward_layernorm")})
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def test_gemma3_language_model_lm_head_is_mapped(tmp_path):
    """Was "unexpected tensor language_model.lm_head.weight": the load failed."""
    tensors = _gemma3_tensors("language_model.model.")
    tensors["language_model.lm_head.weight"] = tensors["language_model.model.embed_tokens.weight"]
    tensors["vision_tower.vision_model.post_layernorm.weight"] = torch.ones(8)
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3))
    save_file({k: v.clone() for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    config, loaded = load_safetensors_folder(tmp_path)
    assert config.architecture == "gemma3" and config.tie_word_embeddings
    assert sorted(loaded) == sorted(_gemma3_tensors("model."))  # the tied head is the embedding
    assert torch.equal(loaded["model.embed_tokens.weight"],
                       tensors["language_model.model.embed_tokens.weight"])
    _build(config, loaded)


def test_gemma3_head_in_two_spellings_is_refused(tmp_path):
    tensors = _gemma3_tensors("model.language_model.")
    tensors["lm_head.weight"] = torch.zeros(32, 16)
    tensors["language_model.lm_head.weight"] = torch.ones(32, 16)
    (tmp_path / "config.json").write_text(json.dumps(GEMMA3))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="lm_head.weight is in both"):
        load_safetensors_folder(tmp_path)
