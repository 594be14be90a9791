"""Load errors a user hits with a file or folder that is wrong, each one ModelLoadError that names
the path and what to do: a GGUF tensor type this server does not know (was: "truncated or
damaged, download it again", which cannot help), a folder without tokenizer.json or that is not a
model folder at all (was: the tokenizers library's "No such file or directory (os error 2)"), a
truncated safetensors shard (now says to download it again). Tiny files written here."""

from __future__ import annotations

import struct

import pytest
import torch

from cloud_server.exceptions import ModelLoadError
from tests.cloud_server.models import test_loader_gguf_review16 as gg
from tests.cloud_server.models import test_loader_safetensors_review17 as st


def _load(path):
    from cloud_server.models.loader import load_model

    return load_model(str(path), device=torch.device("cpu"), dtype=torch.float32, weight_cache=False)


def _with_tensor_type(path, tensor, type_id):
    """The GGUF at ``path`` with ``tensor``'s type id in its header set to ``type_id``."""
    data = bytearray(path.read_bytes())
    name = tensor.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    (ndim,) = struct.unpack_from("<I", data, at)
    struct.pack_into("<I", data, at + 4 + 8 * ndim, type_id)
    path.write_bytes(bytes(data))
    return path


def test_a_gguf_tensor_type_unknown_here_is_not_called_damaged(tmp_path):
    path = _with_tensor_type(gg._model(tmp_path / "new type.gguf"), "blk.0.ffn_up.weight", 250)
    with pytest.raises(ModelLoadError) as err:
        _load(path)
    msg = str(err.value)
    assert "new type.gguf" in msg and "type this server cannot read" in msg, msg
    assert "Q4_K_M" in msg and "damaged" not in msg and "download it again" not in msg


def test_a_gguf_cut_short_is_still_called_damaged(tmp_path):
    path = gg._model(tmp_path / "cut.gguf")
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ModelLoadError, match=r"cut\.gguf: it is truncated or damaged"):
        _load(path)


def test_a_folder_without_tokenizer_json_says_so(tmp_path):
    folder = st._folder(tmp_path)  # config.json and weights, no tokenizer.json
    with pytest.raises(ModelLoadError) as err:
        _load(folder)
    msg = str(err.value)
    assert f"{folder} has no tokenizer.json: download the model's tokenizer.json" in msg, msg
    assert "os error" not in msg


def test_a_folder_that_is_no_model_says_which_folder_to_pass(tmp_path):
    (tmp_path / "Qwen2.5-1.5B").mkdir()
    st._folder(tmp_path / "Qwen2.5-1.5B")
    with pytest.raises(ModelLoadError) as err:
        _load(tmp_path)  # one level above the model's folder
    msg = str(err.value)
    assert f"{tmp_path} is not a Hugging Face model folder" in msg, msg
    assert "config.json, tokenizer.json and *.safetensors" in msg


def test_a_truncated_shard_says_to_download_it_again(tmp_path, monkeypatch):
    monkeypatch.setattr("cloud_server.models.tokenizer.HFTokenizer", lambda path: None)
    folder = st._folder(tmp_path, sharded=True)
    shard = folder / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match=r"model-00002-of-00002\.safetensors: it is truncated "
                                             r"or damaged .*download it again"):
        _load(folder)
