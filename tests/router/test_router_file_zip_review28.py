"""Review 28: a weights.npz whose zip header names a compression method zipfile does not implement
(one flipped byte: a bad copy or disk) is a corrupt router file, not an internal error; a damaged
embedding cache file of that kind is a cache miss."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from hybridllm._exceptions import RouterFileError
from hybridllm.cli import main
from hybridllm.router import embedding_cache
from hybridllm.router.features import EMBEDDING_DIM
from hybridllm.router.router import load_router
from tests.router.fakes import length_router


def _unknown_compression(path: Path) -> None:
    """Set every central-directory entry's compression method to 1 (shrunk: never implemented by
    zipfile), as one flipped byte does; the archive still opens, reading a member raises."""
    data = bytearray(path.read_bytes())
    at = data.find(b"PK\x01\x02")
    assert at >= 0
    while at >= 0:
        data[at + 10 : at + 12] = struct.pack("<H", 1)
        at = data.find(b"PK\x01\x02", at + 4)
    path.write_bytes(bytes(data))


def test_unknown_zip_compression_in_weights_is_a_router_file_error(tmp_path):
    folder = tmp_path / "r"
    length_router().save(folder)
    _unknown_compression(folder / "weights.npz")
    with pytest.raises(RouterFileError, match=r"weights\.npz is corrupt.*retrain or re-copy"):
        load_router(folder)


def test_router_eval_says_the_file_is_corrupt_on_one_line(tmp_path, capsys):
    folder = tmp_path / "r"
    length_router().save(folder)
    _unknown_compression(folder / "weights.npz")
    data = tmp_path / "d.csv"
    data.write_text("prompt,weak,strong\nshort,True,True\n" + "a long question " * 20 + ",False,True\n")
    assert main(["router", "eval", "--router", str(folder), "--data", str(data)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "weights.npz is corrupt" in err
    assert "internal error" not in err


def test_embedding_cache_file_with_unknown_zip_compression_is_a_miss(tmp_path):
    path = tmp_path / "cache.npz"
    emb = np.ones((2, EMBEDDING_DIM), np.float32)
    np.savez(path, embeddings=emb, keys=np.array([b"a" * 16, b"b" * 16], dtype="S16"))
    assert embedding_cache._read(path) is not None  # whole, it is read
    _unknown_compression(path)
    assert embedding_cache._read(path) is None
