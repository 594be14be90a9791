"""A GGUF whose tensors do not fit its own metadata (q rows its heads do not divide, a 1-D matrix)
or are of a type no dequantizer reads (F64, I32): one ModelLoadError naming the file and the
tensor, never a torch RuntimeError, a ValueError or a NotImplementedError out of the loader. A
layout mismatch found when the model is assembled names the file too. Tiny files written here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cloud_server.exceptions import ModelLoadError
from cloud_server.models.loader_gguf import iter_gguf_tensors, open_gguf

H, F, V = 32, 64, 8
SHAPES = {"token_embd.weight": (V, H), "output_norm.weight": (H,), "blk.0.attn_norm.weight": (H,),
          "blk.0.ffn_norm.weight": (H,), "blk.0.attn_q.weight": (H, H), "blk.0.attn_k.weight": (H, H),
          "blk.0.attn_v.weight": (H, H), "blk.0.attn_output.weight": (H, H),
          "blk.0.ffn_gate.weight": (F, H), "blk.0.ffn_up.weight": (F, H), "blk.0.ffn_down.weight": (H, F)}


def _write(path, tensors):
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_embedding_length(H)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_block_count(1)
    w.add_feed_forward_length(F)
    w.add_context_length(64)
    w.add_token_list([f"t{i}" for i in range(V)])
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _model(path, **replace):
    rng = np.random.default_rng(0)
    tensors = {n: rng.random(s, dtype=np.float32) for n, s in SHAPES.items()}
    return _write(path, {**tensors, **replace})


@pytest.fixture(autouse=True)
def _no_vocabulary(monkeypatch):
    """These files hold a token list llama.cpp cannot read; the weights are what is tested."""
    monkeypatch.setattr("cloud_server.models.tokenizer.GGUFTokenizer", lambda path: None)


def _load(path, quantization):
    from cloud_server.models.loader import load_model

    return load_model(str(path), device=torch.device("cpu"), dtype=torch.float32,
                      quantization=quantization, weight_cache=False)


def test_a_consistent_tiny_model_loads(tmp_path):
    assert _load(_model(tmp_path / "ok.gguf"), "none").config.hidden_size == H


@pytest.mark.parametrize("quantization", ["none", "int8"])
@pytest.mark.parametrize("q", [np.ones((30, H), np.float32), np.ones(H * H, np.float32)],
                         ids=["30-rows", "1-d"])
def test_q_rows_the_heads_do_not_divide_name_the_file_and_tensor(tmp_path, q, quantization):
    path = _model(tmp_path / "bad q.gguf", **{"blk.0.attn_q.weight": q})
    # before: torch RuntimeError "shape '[2, 7, 2, 32]' is invalid", or ValueError from unpacking
    with pytest.raises(ModelLoadError, match=r"bad q\.gguf: tensor blk\.0\.attn_q\.weight .*32 rows"):
        _load(path, quantization)


@pytest.mark.parametrize("arr", [np.ones(H, np.float64), np.ones(H, np.int32)], ids=["F64", "I32"])
def test_a_tensor_type_without_a_dequantizer_names_the_file_and_tensor(tmp_path, arr):
    path = _write(tmp_path / "odd.gguf", {"output_norm.weight": arr})
    config, tensors, _ = open_gguf(path)
    # before: NotImplementedError "Dequantization for F64 is not yet implemented"
    with pytest.raises(ModelLoadError, match=r"odd\.gguf: tensor output_norm\.weight \((F64|I32)"):
        list(iter_gguf_tensors(tensors, config))


def test_a_large_matrix_of_such_a_type_fails_before_its_bands_are_read(tmp_path, monkeypatch):
    import cloud_server.models.loader_gguf as lg

    monkeypatch.setattr(lg, "_CHUNK_ELEMENTS", 64)  # the embedding (8 x 32) comes in bands
    path = _write(tmp_path / "wide.gguf", {"token_embd.weight": np.ones((V, H), np.float64)})
    config, tensors, _ = open_gguf(path)
    with pytest.raises(ModelLoadError, match=r"wide\.gguf: tensor token_embd\.weight \(F64"):
        list(iter_gguf_tensors(tensors, config))


def test_a_layer_name_without_a_kind_is_skipped(tmp_path):
    path = _write(tmp_path / "names.gguf", {"blk.0.attn_q": np.ones((H, H), np.float32),
                                             "output_norm.weight": np.ones(H, np.float32)})
    config, tensors, _ = open_gguf(path)
    # before: ValueError "not enough values to unpack (expected 4, got 3)"
    assert [n for n, _ in iter_gguf_tensors(tensors, config)] == ["model.norm.weight"]


def test_a_layout_mismatch_names_the_file(tmp_path):
    path = _model(tmp_path / "emb.gguf", **{"token_embd.weight": np.ones((V + 1, H), np.float32)})
    with pytest.raises(ModelLoadError, match=r"emb\.gguf: weights do not match the llama layout"):
        _load(path, "none")
