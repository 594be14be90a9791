"""Hugging Face folders that are wrong in one way each: a clear ModelLoadError naming the file and
the field or tensor (not a KeyError or a safetensors traceback), and nothing silently dropped or
mixed. Tiny random models written here; no hub access."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from cloud_server.exceptions import ModelLoadError
from cloud_server.models.loader_safetensors import config_from_hf, load_safetensors_folder

CFG = dict(model_type="llama", vocab_size=32, hidden_size=16, intermediate_size=32,
           num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
           tie_word_embeddings=True)


def _tensors(lm_head: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {
        "model.embed_tokens.weight": (32, 16),
        "model.norm.weight": (16,),
        "model.layers.0.input_layernorm.weight": (16,),
        "model.layers.0.post_attention_layernorm.weight": (16,),
        "model.layers.0.self_attn.q_proj.weight": (16, 16),
        "model.layers.0.self_attn.k_proj.weight": (8, 16),
        "model.layers.0.self_attn.v_proj.weight": (8, 16),
        "model.layers.0.self_attn.o_proj.weight": (16, 16),
        "model.layers.0.mlp.gate_proj.weight": (32, 16),
        "model.layers.0.mlp.up_proj.weight": (32, 16),
        "model.layers.0.mlp.down_proj.weight": (16, 32),
    }
    if lm_head:
        shapes["lm_head.weight"] = (32, 16)
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


def _folder(tmp_path, tensors=None, cfg=None, sharded=False):
    tensors = _tensors() if tensors is None else tensors
    (tmp_path / "config.json").write_text(json.dumps(CFG if cfg is None else cfg))
    if not sharded:
        save_file(tensors, str(tmp_path / "model.safetensors"))
        return tmp_path
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    for shard, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(tmp_path / shard))
    weight_map = {n: shard for shard, part in shards.items() for n in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tmp_path


def _build(config, tensors):
    from cloud_server.models.loader import build_model

    return build_model(config, tensors, device=torch.device("cpu"), dtype=torch.float32,
                       max_position=16)


# config.json


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "num_hidden_layers",
                                   "num_attention_heads", "intermediate_size"])
def test_a_missing_field_is_named(field):
    raw = {k: v for k, v in CFG.items() if k != field}
    with pytest.raises(ModelLoadError, match=f"config.json has no '{field}'"):
        config_from_hf(raw)


@pytest.mark.parametrize("value", ["16", None, 16.5, 0, -4, True, [16]])
def test_a_field_of_the_wrong_type_is_named(value):
    with pytest.raises(ModelLoadError, match="'hidden_size'"):
        config_from_hf({**CFG, "hidden_size": value})


def test_zero_heads_is_an_error_not_a_division_by_zero():
    with pytest.raises(ModelLoadError, match="num_attention_heads"):
        config_from_hf({**CFG, "num_attention_heads": 0})


def test_heads_that_do_not_divide_hidden_size_without_head_dim():
    with pytest.raises(ModelLoadError, match="hidden_size 18 is not a multiple of num_attention_heads 4"):
        config_from_hf({**CFG, "hidden_size": 18})
    assert config_from_hf({**CFG, "hidden_size": 18, "head_dim": 4}).head_dim == 4  # given: kept


def test_an_odd_head_dim_is_refused():
    with pytest.raises(ModelLoadError, match="head_dim must be even, got 5"):
        config_from_hf({**CFG, "hidden_size": 20})


def test_a_gqa_ratio_that_does_not_divide_names_both_counts():
    with pytest.raises(ModelLoadError, match=r"num_heads \(4\) must be a multiple of num_kv_heads \(3\)"):
        config_from_hf({**CFG, "num_key_value_heads": 3})


def test_an_unsupported_model_type_lists_the_supported_ones():
    with pytest.raises(ModelLoadError, match="unsupported model_type 'phi3'.*supported:.*llama"):
        config_from_hf({**CFG, "model_type": "phi3"})


def test_config_json_that_is_not_an_object():
    with pytest.raises(ModelLoadError, match="must hold a JSON object"):
        config_from_hf([CFG])


@pytest.mark.parametrize("scaling, match", [
    ({"rope_type": "yarn", "factor": 4.0}, "RoPE scaling 'yarn' is not supported"),
    ({"type": "dynamic", "factor": 2.0}, "RoPE scaling 'dynamic' is not supported"),
    ({"rope_type": "llama3", "factor": 8.0}, "needs \\['original_max_position_embeddings'\\]"),
    ({"rope_type": "linear"}, "needs \\['factor'\\]"),
    ("linear", "rope_scaling must be an object"),
])
def test_rope_scaling_is_checked_with_the_config_not_after_the_weights(scaling, match):
    with pytest.raises(ModelLoadError, match=match):
        config_from_hf({**CFG, "rope_scaling": scaling})


def test_supported_rope_scalings_still_load():
    llama3 = {"rope_type": "llama3", "factor": 32.0, "original_max_position_embeddings": 8192,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    for scaling in (None, {"rope_type": "default"}, {"type": "linear", "factor": 2.0}, llama3):
        assert config_from_hf({**CFG, "rope_scaling": scaling}).rope_scaling == scaling


def test_a_prequantized_checkpoint_is_named():
    quant = {"quant_method": "gptq", "bits": 4}
    with pytest.raises(ModelLoadError, match="quantization_config: 'gptq'"):
        config_from_hf({**CFG, "quantization_config": quant})


def test_unreadable_config_json_names_the_file(tmp_path):
    _folder(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="config.json"):
        load_safetensors_folder(tmp_path)


def test_a_config_error_names_the_folder(tmp_path):
    _folder(tmp_path, cfg={k: v for k, v in CFG.items() if k != "vocab_size"})
    with pytest.raises(ModelLoadError, match=f"{tmp_path / 'config.json'}.*'vocab_size'"):
        load_safetensors_folder(tmp_path)


# safetensors files


def test_a_truncated_file_is_named(tmp_path):
    _folder(tmp_path)
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match="model.safetensors: it is truncated or damaged"):
        load_safetensors_folder(tmp_path)


def test_an_integer_tensor_is_named(tmp_path):
    tensors = _tensors()
    tensors["model.norm.weight"] = torch.ones(16, dtype=torch.int32)
    _folder(tmp_path, tensors)
    with pytest.raises(ModelLoadError, match="model.norm.weight has dtype torch.int32"):
        load_safetensors_folder(tmp_path)


def test_fp16_and_bf16_tensors_load(tmp_path):
    tensors = {k: v.to(torch.bfloat16 if "mlp" in k else torch.float16) for k, v in _tensors().items()}
    config, loaded = load_safetensors_folder(_folder(tmp_path, tensors))
    _build(config, loaded)


def test_a_sharded_model_loads_and_builds(tmp_path):
    config, loaded = load_safetensors_folder(_folder(tmp_path, sharded=True))
    assert sorted(loaded) == sorted(_tensors())
    _build(config, loaded)


def test_an_index_naming_a_missing_shard_names_it(tmp_path):
    _folder(tmp_path, sharded=True)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="model-00002-of-00002.safetensors"):
        load_safetensors_folder(tmp_path)


def test_an_index_naming_a_tensor_its_shard_lacks(tmp_path):
    _folder(tmp_path, sharded=True)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="lm_head.weight"):
        load_safetensors_folder(tmp_path)


def test_only_the_indexed_shards_are_read(tmp_path):
    """A Mistral folder holds consolidated.safetensors beside its HF shards: the same weights
    under Mistral's own names, which were read too and failed the load."""
    _folder(tmp_path, sharded=True)
    save_file({"layers.0.attention.wq.weight": torch.zeros(16, 16)},
              str(tmp_path / "consolidated.safetensors"))
    config, loaded = load_safetensors_folder(tmp_path)
    assert sorted(loaded) == sorted(_tensors())
    _build(config, loaded)


def test_one_tensor_in_two_files_is_refused_not_overwritten(tmp_path):
    """A folder mixing two exports (model.safetensors beside shards): which copy won was the
    order of the file names."""
    tensors = _tensors()
    _folder(tmp_path, tensors)
    save_file({"model.norm.weight": torch.zeros(16)}, str(tmp_path / "model-00001-of-00001.safetensors"))
    with pytest.raises(ModelLoadError, match="model.norm.weight is in both"):
        load_safetensors_folder(tmp_path)


def test_an_untied_config_without_lm_head_is_an_error(tmp_path):
    _folder(tmp_path, cfg={**CFG, "tie_word_embeddings": False})
    with pytest.raises(ModelLoadError, match="tie_word_embeddings false.*lm_head.weight"):
        load_safetensors_folder(tmp_path)


def test_tied_and_untied_heads_as_before(tmp_path):
    cfg = {k: v for k, v in CFG.items() if k != "tie_word_embeddings"}
    (tmp_path / "a").mkdir()
    config, loaded = load_safetensors_folder(_folder(tmp_path / "a", cfg=cfg))  # no flag, no head
    assert config.tie_word_embeddings and "lm_head.weight" not in loaded
    (tmp_path / "b").mkdir()
    config, loaded = load_safetensors_folder(_folder(tmp_path / "b", _tensors(lm_head=True)))
    assert config.tie_word_embeddings and "lm_head.weight" not in loaded  # tied: head ignored
    (tmp_path / "c").mkdir()
    config, loaded = load_safetensors_folder(_folder(
        tmp_path / "c", _tensors(lm_head=True), cfg={**CFG, "tie_word_embeddings": False}))
    assert not config.tie_word_embeddings and "lm_head.weight" in loaded
    _build(config, loaded)


def test_rope_tables_and_a_vision_tower_are_skipped(tmp_path):
    tensors = _tensors()
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(2)
    tensors["vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.ones(4, 3)
    tensors["multi_modal_projector.mm_input_projection_weight"] = torch.ones(4, 16)
    config, loaded = load_safetensors_folder(_folder(tmp_path, tensors))
    assert sorted(loaded) == sorted(_tensors())
    _build(config, loaded)


def test_a_missing_norm_is_named_not_left_at_its_initial_ones(tmp_path):
    tensors = _tensors()
    del tensors["model.layers.0.input_layernorm.weight"]
    with pytest.raises(ModelLoadError, match="no safetensors file holds.*input_layernorm.weight"):
        load_safetensors_folder(_folder(tmp_path, tensors))


@pytest.mark.parametrize("name, shape", [("model.layers.0.self_attn.q_proj.weight", (16, 12)),
                                         ("model.layers.0.mlp.down_proj.weight", (16, 30)),
                                         ("model.embed_tokens.weight", (30, 16))])
def test_a_wrong_shape_names_the_tensor_and_file(tmp_path, name, shape):
    tensors = _tensors()
    tensors[name] = torch.zeros(shape)
    with pytest.raises(ModelLoadError, match=f"model.safetensors: tensor {name} has shape"):
        load_safetensors_folder(_folder(tmp_path, tensors))


def test_an_unexpected_tensor_names_the_file(tmp_path):
    tensors = {**_tensors(), "model.layers.0.self_attn.o_proj.bias": torch.zeros(16)}
    with pytest.raises(ModelLoadError, match="model.safetensors: unexpected tensor .*o_proj.bias"):
        load_safetensors_folder(_folder(tmp_path, tensors))


def test_a_qwen2_folder_with_qkv_biases_loads(tmp_path):
    tensors = _tensors()
    for part, n in (("q", 16), ("k", 8), ("v", 8)):
        tensors[f"model.layers.0.self_attn.{part}_proj.bias"] = torch.randn(n)
    config, loaded = load_safetensors_folder(_folder(tmp_path, tensors, cfg={**CFG, "model_type": "qwen2"}))
    assert config.attention_bias
    _build(config, loaded)
