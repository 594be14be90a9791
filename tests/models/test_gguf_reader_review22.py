"""The header reader (``gguf_header.read_gguf_header``, the cloud loader's ``read_gguf``) gives
what ``gguf.GGUFReader`` gives: every metadata value as ``field.contents()``, and each tensor's
type, data offset, byte and element counts, numpy shape and dtype. It replaced GGUFReader in
``open_gguf``, which parsed every vocabulary item with numpy: 12.9 s for Qwen2.5-Coder's 151k
tokens and merges on every engine start, where the header reader takes about 0.1 s.

Tiny files written here with ``gguf.GGUFWriter`` (every value type, nested arrays, block formats,
a non-default alignment, damaged tables); the catalog GGUFs under ``real``."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from cloud_server.exceptions import ModelLoadError
from cloud_server.models.loader_gguf import open_gguf, read_gguf
from hybridllm.models.gguf_header import read_gguf_header

VOCAB = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
         "tokenizer.ggml.merges")


def _reader_view(path):
    """(metadata, tensor rows) as GGUFReader reads them."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in reader.fields.items()}
    rows = [(t.name, t.tensor_type, int(t.data_offset), int(t.n_bytes), int(t.n_elements),
             tuple(t.data.shape), t.data.dtype) for t in reader.tensors]
    return meta, rows


def _assert_reads_as_gguf_reader(path):
    meta, rows = _reader_view(path)
    assert read_gguf_header(path).metadata == meta
    fast_meta, num_tokens, infos = read_gguf(path)
    assert fast_meta == {k: v for k, v in meta.items() if k not in VOCAB}
    assert num_tokens == len(meta["tokenizer.ggml.tokens"])
    assert [(t.name, t.tensor_type, t.data_offset, t.n_bytes, t.n_elements, t.shape, t.dtype)
            for t in infos] == rows


def _quantized(kind_name, shape):
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(0)
    return quantize(rng.standard_normal(shape).astype(np.float32), gguf.GGMLQuantizationType[kind_name])


def _write(path, *, alignment=None, tensors=None):
    import gguf

    Q = gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_embedding_length(32)
    w.add_head_count(2)
    w.add_block_count(1)
    w.add_feed_forward_length(64)
    w.add_token_list(["a", "bé", "", "<|im_end|>"])
    w.add_token_scores([0.5, -1.25, 3.0, 1e-7])
    w.add_token_types([1, 1, 3, 3])
    w.add_token_merges(["a b", "b é"])
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_int32("t.i32", -(2**31))
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", 1e300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "Grüße\n")
    w.add_array("t.floats", [0.1, 2.5, -3.0])
    w.add_array("t.bools", [True, False])
    w.add_array("t.nested", [[1, 2], [3], [4, 5, 6]])  # contents() flattens nested arrays
    w.add_array("t.nested_strings", [["x", "yz"], ["w"]])
    for name, arr, raw in tensors or [
        ("token_embd.weight", np.ones((4, 32), np.float32), None),
        ("blk.0.f16", np.arange(64, dtype=np.float16).reshape(2, 32), None),
        ("blk.0.i8", np.arange(-8, 8, dtype=np.int8), None),
        ("blk.0.i16", np.arange(6, dtype=np.int16).reshape(1, 2, 3), None),
        ("blk.0.i32", np.arange(3, dtype=np.int32), None),
        ("blk.0.i64", np.arange(3, dtype=np.int64), None),
        ("blk.0.f64", np.arange(5, dtype=np.float64), None),
        ("blk.0.q8", _quantized("Q8_0", (3, 64)), Q.Q8_0),
        ("blk.0.q4", _quantized("Q4_0", (2, 32)), Q.Q4_0),
        ("blk.0.bf16", _quantized("BF16", (2, 8)), Q.BF16),
        ("blk.0.q4k", np.zeros((2, 144), np.uint8), Q.Q4_K),  # stored as bytes: [rows, row bytes]
    ]:
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64, 256])
def test_every_value_and_tensor_reads_as_gguf_reader_reads_it(tmp_path, alignment):
    path = _write(tmp_path / "all.gguf", alignment=alignment)
    _assert_reads_as_gguf_reader(path)
    header = read_gguf_header(path, skip=VOCAB)
    assert header.alignment == (alignment or 32)
    assert all(t.data_offset % header.alignment == 0 for t in header.tensors)
    assert header.array_lengths == {"tokenizer.ggml.tokens": 4, "tokenizer.ggml.scores": 4,
                                    "tokenizer.ggml.token_type": 4, "tokenizer.ggml.merges": 2}
    assert header.metadata["t.nested_strings"] == ["x", "yz", "w"]


def test_open_gguf_needs_no_gguf_reader(tmp_path, monkeypatch):
    """The loader reads the header itself: GGUFReader took 12.9 s on Qwen2.5-Coder's vocabulary."""
    import gguf

    path = _write(tmp_path / "m.gguf", tensors=[("token_embd.weight", np.ones((4, 32), np.float32), None)])

    def refused(*args, **kwargs):
        raise AssertionError("GGUFReader parses the whole vocabulary")

    monkeypatch.setattr(gguf, "GGUFReader", refused)
    config, tensors, meta = open_gguf(path)
    assert config.vocab_size == 4 and [t.name for t in tensors.tensors] == ["token_embd.weight"]
    assert "tokenizer.ggml.tokens" not in meta and meta["t.nested"] == [1, 2, 3, 4, 5, 6]


def _table_start(data: bytes, name: str) -> int:
    """The offset of tensor ``name``'s row in the tensor table (its name's length)."""
    raw = name.encode()
    return data.index(struct.pack("<Q", len(raw)) + raw)


def test_a_truncated_tensor_table_names_the_offset(tmp_path):
    path = _write(tmp_path / "cut.gguf")
    data = path.read_bytes()
    at = _table_start(data, "blk.0.q8")
    path.write_bytes(data[: at + 12])  # the tensor's name cut short
    with pytest.raises(ValueError, match=rf"cut\.gguf has damaged GGUF metadata at offset {at}: "
                                         r"tensor name \(8 bytes\) runs past the end"):
        read_gguf_header(path)
    with pytest.raises(ModelLoadError, match=r"cut\.gguf: it is truncated or damaged .*offset"):
        open_gguf(path)


def test_a_dimension_count_the_file_cannot_hold_is_refused(tmp_path):
    path = _write(tmp_path / "dims.gguf")
    data = bytearray(path.read_bytes())
    at = _table_start(data, "blk.0.q8") + 8 + len("blk.0.q8")
    struct.pack_into("<I", data, at, 2**31)  # 16 GiB of dimensions
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"offset {at}: dimension count 2147483648 is more than"):
        read_gguf_header(path)


def test_tensor_data_past_the_end_is_damaged(tmp_path):
    path = _write(tmp_path / "short.gguf")
    path.write_bytes(path.read_bytes()[:-40])  # the last tensor's data cut short
    with pytest.raises(ModelLoadError, match=r"truncated or damaged .*tensor blk\.0\.q4k's 288 bytes "
                                             r"at offset \d+ run past the end of the file"):
        open_gguf(path)


def test_a_tensor_named_twice_is_damaged(tmp_path):
    path = _write(tmp_path / "twice.gguf")
    data = path.read_bytes().replace(b"blk.0.i32", b"blk.0.i64")
    path.write_bytes(data)
    with pytest.raises(ValueError, match="tensor 'blk.0.i64' appears twice"):
        read_gguf_header(path)


@pytest.mark.parametrize("value", [0, 48])
def test_an_alignment_not_a_power_of_two_is_refused(tmp_path, value):
    path = _write(tmp_path / "align.gguf", alignment=64)
    data = bytearray(path.read_bytes())
    key = b"general.alignment"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4
    struct.pack_into("<I", data, at, value)
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"bad general.alignment {value}"):
        read_gguf_header(path)


def test_gguf_blocks_reads_the_stored_blocks(tmp_path):
    """The ONNX rewrite's blocks come from the header's offsets: the same weights as the file's."""
    import gguf
    from gguf.quants import dequantize

    from hybridllm.models._gguf_blocks import gguf_blocks
    from hybridllm.models.onnx_gguf import gguf_architecture

    q8 = _quantized("Q8_0", (4, 64))
    path = _write(tmp_path / "b.gguf", alignment=64,
                  tensors=[("blk.0.ffn_up.weight", q8, gguf.GGMLQuantizationType.Q8_0)])
    tensors, load = gguf_blocks(path)
    assert list(tensors) == ["blk.0.ffn_up.weight"] and gguf_architecture(path) == "llama"
    want = dequantize(q8, gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_allclose(load("blk.0.ffn_up.weight").dequantize(), want, rtol=0, atol=1e-6)


@pytest.mark.real
def test_the_catalog_gguf_reads_as_gguf_reader_reads_it():
    """SmolLM2's GGUF (a 49k-token vocabulary): GGUFReader takes 5 s over it. Qwen2.5-Coder-0.5B's
    read the same too (2026-12-03), but GGUFReader takes 19 s there, so it is not repeated."""
    from hybridllm.models import pull

    _assert_reads_as_gguf_reader(pull("smollm2-135m-instruct"))
