"""gguf_to_hf_folder keeps the GGUF's RoPE scaling: a linear one is written to config.json (it
was dropped, so the exported model ran long positions unscaled); one a config.json cannot spell
(Llama 3.x's rope_freqs, yarn) is refused before anything is written. The GGUF reading is faked."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cloud_server.exceptions import ModelLoadError
from cloud_server.models import export_hf
from cloud_server.models.config import ModelConfig
from cloud_server.models.loader_safetensors import config_from_hf


def _fake(monkeypatch, rope_scaling=None, **meta_extra):
    config = ModelConfig("llama", 32, 16, 32, 1, 4, 2, 4, tie_word_embeddings=True,
                         rope_scaling=rope_scaling)
    meta = {"general.architecture": "llama", "tokenizer.ggml.model": "gpt2", **meta_extra}
    monkeypatch.setattr(export_hf, "load_gguf",
                        lambda path: (config, {"model.norm.weight": np.ones(16, np.float32)}, meta))
    monkeypatch.setattr(export_hf, "write_tokenizer",
                        lambda path, out: (out / "tokenizer.json").write_text("{}"))


def test_linear_rope_scaling_is_written(tmp_path, monkeypatch):
    _fake(monkeypatch, {"rope_type": "linear", "factor": 4.0},
          **{"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0})
    out = export_hf.gguf_to_hf_folder("m.gguf", tmp_path / "hf")
    raw = json.loads((out / "config.json").read_text())
    assert raw["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}
    assert config_from_hf(raw).rope_scaling == {"rope_type": "linear", "factor": 4.0}


def test_no_rope_scaling_writes_none(tmp_path, monkeypatch):
    _fake(monkeypatch, **{"llama.rope.scaling.type": "none"})
    raw = json.loads((export_hf.gguf_to_hf_folder("m.gguf", tmp_path / "hf") / "config.json").read_text())
    assert "rope_scaling" not in raw and config_from_hf(raw).rope_scaling is None


def test_rope_freqs_of_ones_is_no_scaling(tmp_path, monkeypatch):
    _fake(monkeypatch, {"rope_type": "freq_factors", "factors": [1.0, 1.0]})
    raw = json.loads((export_hf.gguf_to_hf_folder("m.gguf", tmp_path / "hf") / "config.json").read_text())
    assert "rope_scaling" not in raw


def test_llama3_rope_freqs_is_refused_and_nothing_written(tmp_path, monkeypatch):
    """A config.json without it was a silently different model past the short positions."""
    _fake(monkeypatch, {"rope_type": "freq_factors", "factors": [1.0, 1.5, 8.0]})
    with pytest.raises(ModelLoadError, match="m.gguf: its RoPE scaling is a rope_freqs tensor"):
        export_hf.gguf_to_hf_folder("m.gguf", tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []


def test_yarn_is_refused_and_nothing_written(tmp_path, monkeypatch):
    _fake(monkeypatch, **{"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0})
    with pytest.raises(ModelLoadError, match="RoPE scaling 'yarn'"):
        export_hf.gguf_to_hf_folder("m.gguf", tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []
