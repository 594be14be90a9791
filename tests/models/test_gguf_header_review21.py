"""A damaged GGUF header is a ValueError naming the file and the offset, as documented.

Before: a length past the file's end raised OverflowError (a key's length beyond any offset) or
struct.error (a header cut short), or was read as if whole (a last string or array cut short came
back short, or as a count of billions: a vocabulary size from nowhere)."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import pytest

from hybridllm.models.gguf_header import read_gguf_metadata

HEADER = b"GGUF" + struct.pack("<IQ", 3, 0)  # magic, version, tensor count: 16 bytes


def _gguf(tmp_path: Path, body: bytes, count: int = 1) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(HEADER + struct.pack("<Q", count) + body)
    return path


def _key(name: bytes = b"k") -> bytes:
    return struct.pack("<Q", len(name)) + name


def _string(text: bytes) -> bytes:
    return struct.pack("<I", 8) + struct.pack("<Q", len(text)) + text


DAMAGED = {
    # offset 24: the key's length, 2**63 (OverflowError before)
    "key-length": (struct.pack("<Q", 2**63) + b"\0" * 16, 24),
    # the offsets below: key "k" at 24, its value type at 33, the value at 37
    # the string's length, beyond the file (read as "" before)
    "string-length": (_key() + struct.pack("<I", 8) + struct.pack("<Q", 2**63 + 5), 37),
    # a last string cut short (read as "ab" before)
    "string-cut-short": (_key() + struct.pack("<I", 8) + struct.pack("<Q", 100) + b"ab", 37),
    # an array of 2**62 uint8 in a few bytes (its length returned as the value before)
    "array-length": (_key() + struct.pack("<I", 9) + struct.pack("<IQ", 0, 2**62) + b"\0" * 8, 37),
    # an array of 2**64 - 1 strings
    "string-array-length": (_key() + struct.pack("<I", 9) + struct.pack("<IQ", 8, 2**64 - 1), 37),
    # a value cut short: a uint32 with two bytes left (struct.error before)
    "value-cut-short": (_key() + struct.pack("<I", 4) + b"\0\0", 37),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_a_damaged_length_is_a_value_error_naming_the_file_and_offset(tmp_path, name):
    body, offset = DAMAGED[name]
    path = _gguf(tmp_path, body)
    with pytest.raises(ValueError, match=rf"^{path} has damaged GGUF metadata at offset {offset}: "):
        read_gguf_metadata(path)


def test_a_metadata_count_the_file_cannot_hold_is_refused(tmp_path):
    path = _gguf(tmp_path, _key() + struct.pack("<I", 4) + b"\0" * 4, count=2**64 - 1)
    with pytest.raises(ValueError, match=rf"^{path} has damaged GGUF metadata at offset 16: metadata count"):
        read_gguf_metadata(path)


@pytest.mark.parametrize("raw", [b"GGUF" + struct.pack("<I", 3), HEADER + b"\0\0"],
                         ids=["8-bytes", "18-bytes"])
def test_a_header_cut_short_is_a_value_error(tmp_path, raw):
    """Before: struct.error, which the docstring left to callers."""
    path = tmp_path / "short.gguf"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=rf"^{path} has damaged GGUF metadata at offset (8|16): "):
        read_gguf_metadata(path)


def test_an_empty_file_is_named(tmp_path):
    """Before: mmap's own "cannot mmap an empty file", which does not say which."""
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=rf"^{path} is empty"):
        read_gguf_metadata(path)


def test_a_huge_length_allocates_nothing_of_its_size(tmp_path):
    path = _gguf(tmp_path, _key() + struct.pack("<I", 8) + struct.pack("<Q", 2**40) + b"x" * 4096)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="string"):
            read_gguf_metadata(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_a_whole_header_reads_as_before(tmp_path):
    body = (
        _key(b"general.architecture") + _string(b"llama")
        + _key(b"llama.context_length") + struct.pack("<I", 4) + struct.pack("<I", 8192)
        + _key(b"tokenizer.ggml.tokens") + struct.pack("<I", 9) + struct.pack("<IQ", 8, 2)
        + struct.pack("<Q", 1) + b"a" + struct.pack("<Q", 2) + b"bc"
        + _key(b"tokenizer.ggml.scores") + struct.pack("<I", 9) + struct.pack("<IQ", 6, 2) + b"\0" * 8
        + _key(b"nested") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1)
        + struct.pack("<IQ", 0, 3) + b"xyz"
        + _key(b"empty") + struct.pack("<I", 9) + struct.pack("<IQ", 8, 0)
        + _key(b"flag") + struct.pack("<I", 7) + b"\1"
        + _key(b"rope") + struct.pack("<I", 12) + struct.pack("<d", 1e6)
    )
    meta = read_gguf_metadata(_gguf(tmp_path, body, count=8))
    assert meta == {"general.architecture": "llama", "llama.context_length": 8192,
                    "tokenizer.ggml.tokens": 2, "tokenizer.ggml.scores": 2, "nested": 1, "empty": 0,
                    "flag": True, "rope": 1e6}
