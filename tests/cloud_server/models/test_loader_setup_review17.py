"""``assemble_model`` sets the model up (RoPE tables) inside its error handling: a RoPE scaling
that the config check lets through but the tables cannot take is a ModelLoadError naming the
model, not a raw RuntimeError/ValueError. Tiny random models written here; no hub access."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from cloud_server.exceptions import ModelLoadError
from tests.cloud_server.models.test_loader_safetensors_review17 import CFG, _tensors

BAD_ROPE = [
    {"rope_type": "freq_factors", "factors": [1.0, 2.0, 3.0]},  # head_dim 4: two pairs, not three
    {"rope_type": "linear", "factor": "two"},
    {"rope_type": "linear", "factor": [2]},
    {"rope_type": "llama3", "factor": 8, "original_max_position_embeddings": "long"},
]


@pytest.mark.parametrize("rope", BAD_ROPE)
def test_a_rope_the_tables_cannot_take_is_a_model_load_error(rope):
    from cloud_server.models.loader import build_model
    from cloud_server.models.loader_safetensors import config_from_hf

    config = config_from_hf({**CFG, "rope_scaling": rope})
    with pytest.raises(ModelLoadError, match="cannot set up the llama model"):
        build_model(config, _tensors(), device=torch.device("cpu"), dtype=torch.float32, max_position=16)


def test_load_model_names_the_folder(tmp_path):
    from tokenizers import Tokenizer, models

    from cloud_server.models.loader import load_model

    (tmp_path / "config.json").write_text(json.dumps({**CFG, "rope_scaling": BAD_ROPE[0]}))
    save_file(_tensors(), str(tmp_path / "model.safetensors"))
    Tokenizer(models.WordLevel({"a": 0}, unk_token="a")).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ModelLoadError, match="cannot set up") as err:
        load_model(str(tmp_path), device=torch.device("cpu"), dtype=torch.float32)
    assert str(tmp_path) in str(err.value)


def test_a_good_rope_still_loads():
    from cloud_server.models.loader import build_model
    from cloud_server.models.loader_safetensors import config_from_hf

    config = config_from_hf({**CFG, "rope_scaling": {"rope_type": "freq_factors", "factors": [1.0, 2.0]}})
    model = build_model(config, _tensors(), device=torch.device("cpu"), dtype=torch.float32, max_position=16)
    assert model.ropes[0].cos.shape == (16, 2)
