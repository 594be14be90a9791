"""gguf_to_hf_folder into a folder that is not empty: refused before any work, the old files
untouched; a failed export leaves no half-written folder. The GGUF reading is faked."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cloud_server.exceptions import ModelLoadError
from cloud_server.models import export_hf
from cloud_server.models.config import ModelConfig


@pytest.fixture
def fake_gguf(monkeypatch):
    calls = []
    config = ModelConfig("llama", 32, 16, 32, 1, 4, 2, 4, tie_word_embeddings=True)
    meta = {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2"}

    def load(path):
        calls.append(path)
        return config, {"model.norm.weight": np.ones(16, np.float32)}, meta

    def tokenizer(path, out):
        (out / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(export_hf, "load_gguf", load)
    monkeypatch.setattr(export_hf, "write_tokenizer", tokenizer)
    return calls


def test_exports_into_a_new_or_empty_folder(tmp_path, fake_gguf):
    out = export_hf.gguf_to_hf_folder("m.gguf", tmp_path / "new" / "hf")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    (tmp_path / "empty").mkdir()
    export_hf.gguf_to_hf_folder("m.gguf", tmp_path / "empty")
    assert json.loads((tmp_path / "empty" / "config.json").read_text())["model_type"] == "llama"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "new"]  # no work folder left


def test_a_non_empty_folder_is_refused_and_kept(tmp_path, fake_gguf):
    """Another model's shards left there were read with the new file by the loader."""
    out = tmp_path / "hf"
    out.mkdir()
    (out / "model-00001-of-00002.safetensors").write_bytes(b"old")
    with pytest.raises(ModelLoadError, match="not an empty folder"):
        export_hf.gguf_to_hf_folder("m.gguf", out)
    assert [p.name for p in out.iterdir()] == ["model-00001-of-00002.safetensors"]
    assert not fake_gguf  # refused before reading the GGUF


def test_a_failed_export_leaves_nothing(tmp_path, fake_gguf, monkeypatch):
    def broken(path, out):
        raise RuntimeError("tokenizer failed")

    monkeypatch.setattr(export_hf, "write_tokenizer", broken)
    with pytest.raises(RuntimeError, match="tokenizer failed"):
        export_hf.gguf_to_hf_folder("m.gguf", tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []
