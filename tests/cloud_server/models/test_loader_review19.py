"""Checkpoints that lack a tensor the model needs, or give a flag as a string: one ModelLoadError
naming the file and the tensor or field, never a model that loads with a norm left at its initial
ones, a head silently replaced by the embedding, or a bias that fails at the first request. Tiny
synthetic checkpoints written here (GGUF via ``gguf``, safetensors via ``safetensors``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cloud_server.exceptions import ModelLoadError
from cloud_server.models.tokenizer import HFTokenizer as REAL_HF_TOKENIZER

from .test_loader_gguf_review16 import SHAPES, _write
from .test_loader_safetensors_review17 import CFG, _folder, _tensors


@pytest.fixture(autouse=True)
def _no_tokenizers(monkeypatch):
    """The weights are what is tested (the GGUF token list here is not a real vocabulary)."""
    monkeypatch.setattr("cloud_server.models.tokenizer.GGUFTokenizer", lambda path: None)
    monkeypatch.setattr("cloud_server.models.tokenizer.HFTokenizer", lambda path: None)


def _load(path, quantization="none"):
    from cloud_server.models.loader import load_model

    return load_model(str(path), device=torch.device("cpu"), dtype=torch.float32,
                      quantization=quantization, weight_cache=False)


def _gguf(path, drop=(), **replace):
    rng = np.random.default_rng(0)
    tensors = {n: rng.random(s, dtype=np.float32) for n, s in SHAPES.items() if n not in drop}
    return _write(path, {**tensors, **replace})


@pytest.mark.parametrize("quantization", ["none", "int8"])
@pytest.mark.parametrize(("dropped", "hf_name"), [
    ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
    ("blk.0.ffn_norm.weight", "model.layers.0.post_attention_layernorm.weight"),
    ("output_norm.weight", "model.norm.weight"),
])
def test_a_gguf_without_a_norm_names_it(tmp_path, dropped, hf_name, quantization):
    path = _gguf(tmp_path / "nonorm.gguf", drop=(dropped,))
    # before: the model loaded, that norm left at its initial ones (wrong answers, no error)
    with pytest.raises(ModelLoadError, match=rf"nonorm\.gguf: .*missing .*{hf_name}"):
        _load(path, quantization)


def test_a_gguf_without_a_fused_part_names_the_tensor(tmp_path):
    path = _gguf(tmp_path / "noq.gguf", drop=("blk.0.attn_q.weight",))
    # before: "weights do not match the llama layout: 'self_attn.q_proj.weight'" (no layer)
    with pytest.raises(ModelLoadError,
                       match=r"noq\.gguf: .*missing model\.layers\.0\.self_attn\.q_proj\.weight"):
        _load(path)


def test_a_folder_with_some_biases_of_a_layer_names_the_missing_one(tmp_path):
    tensors = {**_tensors(), "model.layers.0.self_attn.q_proj.bias": torch.ones(16),
               "model.layers.0.self_attn.k_proj.bias": torch.ones(8)}
    folder = _folder(tmp_path, tensors, {**CFG, "attention_bias": True})
    # before: it loaded with a 24-row bias on a 32-row layer, a RuntimeError at the first request
    with pytest.raises(ModelLoadError, match=r"missing model\.layers\.0\.self_attn\.v_proj\.bias"):
        _load(folder)


def test_a_bias_mismatch_names_the_layer(tmp_path):
    folder = _folder(tmp_path, cfg={**CFG, "model_type": "qwen2"})  # Qwen2 has q/k/v biases
    # before: "bias given to a layer without one, or missing": which layer, not said
    with pytest.raises(ModelLoadError, match=r"model\.layers\.0\.self_attn\.qkv_proj: bias"):
        _load(folder)


@pytest.mark.parametrize("field", ["tie_word_embeddings", "attention_bias"])
@pytest.mark.parametrize("value", ["false", "true", 0, [True]])
def test_a_flag_that_is_not_a_boolean_is_named(tmp_path, field, value):
    folder = _folder(tmp_path, _tensors(lm_head=True), {**CFG, field: value})
    # before: bool("false") is True: the checkpoint's own lm_head was dropped for the embedding
    with pytest.raises(ModelLoadError, match=rf"config\.json: .*'{field}' must be true or false"):
        _load(folder)


def test_null_flags_take_their_defaults(tmp_path):
    cfg = {**CFG, "tie_word_embeddings": None, "attention_bias": None}
    loaded = _load(_folder(tmp_path, _tensors(lm_head=True), cfg))
    assert not loaded.config.tie_word_embeddings and not loaded.config.attention_bias


def test_an_untied_head_is_kept(tmp_path):
    tensors = _tensors(lm_head=True)
    loaded = _load(_folder(tmp_path, tensors, {**CFG, "tie_word_embeddings": False}))
    assert torch.equal(loaded.model.lm_head.weight, tensors["lm_head.weight"])


def test_a_mixture_of_experts_gguf_is_named(tmp_path):
    import gguf

    rng = np.random.default_rng(0)
    tensors = {n: rng.random(s, dtype=np.float32) for n, s in SHAPES.items()
               if not n.startswith("blk.0.ffn_") or n == "blk.0.ffn_norm.weight"}
    w = gguf.GGUFWriter(str(tmp_path / "moe.gguf"), "llama")  # as Mixtral's GGUFs: arch "llama"
    w.add_embedding_length(32)
    w.add_head_count(2)
    w.add_block_count(1)
    w.add_feed_forward_length(64)
    w.add_expert_count(2)
    w.add_expert_used_count(1)
    w.add_token_list([f"t{i}" for i in range(8)])
    for name, arr in {**tensors, "blk.0.ffn_gate_exps.weight": np.ones((2, 64, 32), np.float32)}.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # before: "weights do not match the llama layout: 'mlp.gate_proj.weight'" after reading it all
    with pytest.raises(ModelLoadError, match=r"moe\.gguf: .*llama\.expert_count is 2: mixture-of-experts"):
        _load(tmp_path / "moe.gguf")


@pytest.mark.parametrize(("extra", "shape"), [("blk.1.attn_q.weight", (32, 32)),
                                              ("blk.0.attn_output.bias", (32,))])
def test_a_gguf_tensor_the_model_has_no_place_for_is_named(tmp_path, extra, shape):
    path = _gguf(tmp_path / "extra.gguf", **{extra: np.ones(shape, np.float32)})
    # before: "missing model.layers.1.self_attn.k_proj.weight" (KeyError 'model.layers.1...'), or
    # the bias taken as o_proj's weight: "weight (32,) != (32, 32)"
    hf = {"blk.1.attn_q.weight": r"model\.layers\.1\.self_attn\.q_proj\.weight",
          "blk.0.attn_output.bias": r"model\.layers\.0\.self_attn\.o_proj\.bias"}[extra]
    with pytest.raises(ModelLoadError, match=rf"extra\.gguf: .*unexpected tensors? \[?'?{hf}"):
        _load(path)


def test_a_weights_file_given_for_its_folder_is_named(tmp_path):
    folder = _folder(tmp_path)
    # before: "cannot resolve model '.../model.safetensors': Unknown model ... Known models: ..."
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is a file but not a \.gguf; .*folder"):
        _load(folder / "model.safetensors")


def test_a_path_that_does_not_exist_is_named(tmp_path):
    # before: "cannot resolve model '.../gone': Unknown model ..., or pass ... a local .gguf file"
    with pytest.raises(ModelLoadError, match=r"model path .*gone does not exist"):
        _load(tmp_path / "gone")


def test_a_folder_without_tokenizer_json_fails_before_its_weights_are_read(tmp_path, monkeypatch):
    import cloud_server.models.loader_safetensors as ls

    monkeypatch.setattr("cloud_server.models.tokenizer.HFTokenizer", REAL_HF_TOKENIZER)
    read = []
    monkeypatch.setattr(ls, "load_safetensors_folder", lambda folder: read.append(folder))
    # before: every shard was read (minutes and the model's memory for a large one), then this
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json"):
        _load(_folder(tmp_path))
    assert read == []


@pytest.mark.parametrize("types", [["sliding_window"], ["chunked_attention"], [["full_attention"]]])
def test_a_layer_type_the_engine_does_not_know_is_named(types):
    from cloud_server.models.loader_safetensors import config_from_hf

    cfg = {**CFG, "model_type": "gemma3_text", "head_dim": 4, "layer_types": types}
    # before: accepted and run as a global layer (a sliding layer without its window)
    with pytest.raises(ModelLoadError, match=r"layer_types may only name .*sliding_attention"):
        config_from_hf(cfg)
    assert config_from_hf({**cfg, "layer_types": ["sliding_attention"]}).layer_types == ["sliding_attention"]


@pytest.mark.parametrize("types", [6, "full_attention", {"0": "full_attention"}])
def test_layer_types_that_are_not_a_list_are_named(types):
    from cloud_server.models.loader_safetensors import config_from_hf

    # before: list(6) a bare TypeError; a string or object split into its characters or keys
    with pytest.raises(ModelLoadError, match=r"'layer_types' must be a list"):
        config_from_hf({**CFG, "model_type": "gemma3_text", "head_dim": 4, "layer_types": types})
