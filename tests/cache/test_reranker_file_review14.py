"""A reranker file cut short (a copy or a training run stopped part way, a full disk) is a
CacheError that names it, not a zipfile.BadZipFile traceback."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm._exceptions import CacheError
from hybridllm.cache._reranker_weights import _write
from hybridllm.cache.reranker_file import read_info, read_weights


@pytest.fixture
def whole(tmp_path):
    path = tmp_path / "whole.npz"
    _write(path, {"w:head.bias": np.arange(4000, dtype=np.float32)}, threshold=0.8, min_similarity=0.5,
           digest="d" * 16, metrics={"test_precision": 0.96})
    return path


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_a_truncated_file_is_a_cache_error(tmp_path, whole, keep):
    data = whole.read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CacheError, match="cut.npz"):
        read_info(cut)
    with pytest.raises(CacheError, match="cut.npz"):
        read_weights(cut)


def test_a_damaged_member_is_a_cache_error(tmp_path, whole):
    data = bytearray(whole.read_bytes())
    start = data.find(b"w:head.bias.npy") + 100  # inside the member's compressed bytes
    data[start : start + 50] = b"\xff" * 50
    bad = tmp_path / "bad.npz"
    bad.write_bytes(bytes(data))
    read_info(bad)  # the small fields are elsewhere in the archive
    with pytest.raises(CacheError, match="bad.npz"):
        read_weights(bad)
