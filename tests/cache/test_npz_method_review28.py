"""A cache verifier or reranker file with one flipped byte in a zip header (the compression method
of a member, as a bad copy or disk gives) is refused as damaged, naming the file, as a truncated
one is; before, np.load's NotImplementedError ("That compression method is not supported") reached
the caller as an internal error. The router's files had the same gap (cf9fc04)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hybridllm import CacheError, ConfigError
from hybridllm.cache import reranker_file
from hybridllm.cache._verifier_spec import load_verifier
from hybridllm.cache.verifier import HitVerifier

DATA = Path(__file__).resolve().parents[2] / "hybridllm" / "_data"


def _method_flipped(name: str, tmp_path: Path) -> Path:
    path = tmp_path / name
    shutil.copy(DATA / name, path)
    data = bytearray(path.read_bytes())
    entries = [i for i in range(len(data) - 4) if data[i:i + 4] == b"PK\x01\x02"]
    assert entries  # the members' central directory entries
    for entry in entries:
        data[entry + 10] = 99  # a member's compression method: one zipfile does not implement
    path.write_bytes(bytes(data))
    return path


def test_a_verifier_file_with_an_unknown_compression_method_is_damaged(tmp_path):
    path = _method_flipped("cache_verifier.npz", tmp_path)
    with pytest.raises(CacheError, match="cache_verifier.npz"):
        HitVerifier.load(path)
    with pytest.raises(ConfigError, match="cache_verifier.npz"):  # as the verifier setting names it
        load_verifier(path)


def test_a_reranker_file_with_an_unknown_compression_method_is_damaged(tmp_path):
    path = _method_flipped("cache_reranker.npz", tmp_path)
    with pytest.raises(CacheError, match="cache_reranker.npz"):
        reranker_file.read_info(path)
    with pytest.raises(ConfigError, match="cache_reranker.npz"):  # as the verifier setting names it
        load_verifier(path)
