"""A GGUF cut short, damaged or without what a model needs: one ModelLoadError naming the file and
the fix, never a numpy IndexError or a KeyError out of the loader. Tiny files written here."""

from __future__ import annotations

import numpy as np
import pytest

from cloud_server.exceptions import ModelLoadError
from cloud_server.models.loader_gguf import open_gguf


def _write(path, *, tokens=True, block_count=True):
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_embedding_length(32)
    w.add_head_count(2)
    if block_count:
        w.add_block_count(1)
    w.add_feed_forward_length(64)
    if tokens:
        w.add_token_list(["a", "b", "c"])
    w.add_tensor("token_embd.weight", np.ones((3, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_tiny_gguf_opens(tmp_path):
    config, tensors, _ = open_gguf(_write(tmp_path / "ok.gguf"))
    assert config.hidden_size == 32 and config.num_layers == 1
    assert [t.name for t in tensors.tensors] == ["token_embd.weight"]


@pytest.mark.parametrize("cut", [0, 3, 24, 60, -100])
def test_a_truncated_gguf_names_the_file_and_the_fix(tmp_path, cut):
    data = _write(tmp_path / "ok.gguf").read_bytes()
    path = tmp_path / "dir with space é" / "cut.gguf"
    path.parent.mkdir()
    path.write_bytes(data[:cut])
    with pytest.raises(ModelLoadError, match="cannot read GGUF file .*cut.gguf") as err:
        open_gguf(path)
    if cut:  # an empty file is a clear mmap error already
        assert "truncated or damaged" in str(err.value) and "again" in str(err.value)


def test_a_gguf_without_a_tokenizer_is_a_load_error(tmp_path):
    path = _write(tmp_path / "notok.gguf", tokens=False)
    with pytest.raises(ModelLoadError, match=r"notok.gguf has no tokenizer"):
        open_gguf(path)  # before: KeyError 'tokenizer.ggml.tokens'


def test_a_gguf_without_a_size_names_the_missing_key(tmp_path):
    path = _write(tmp_path / "noblocks.gguf", block_count=False)
    with pytest.raises(ModelLoadError, match=r"noblocks.gguf: .*llama.block_count"):
        open_gguf(path)  # before: TypeError from int(None)
