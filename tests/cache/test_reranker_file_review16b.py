"""A reranker file's version check says what to do: a file newer than this hybridllm asks for an
upgrade (retraining it with the old one would lose what is new), an older one for retraining."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hybridllm._exceptions import CacheError
from hybridllm.cache.reranker_file import FORMAT, VERSION, read_info


def _write_file(path: Path, version: object) -> Path:
    np.savez(path, format=np.array(FORMAT), version=np.array(version), threshold=np.array(0.5),
             min_similarity=np.array(0.5), weights_digest=np.array("0123456789abcdef"))
    return path


def test_a_newer_file_asks_for_an_upgrade(tmp_path: Path) -> None:
    with pytest.raises(CacheError, match=f"version-{VERSION + 1} reranker.*upgrade hybridllm") as err:
        read_info(_write_file(tmp_path / "new.npz", VERSION + 1))
    assert "train_reranker" in str(err.value)


def test_an_older_file_asks_for_retraining(tmp_path: Path) -> None:
    with pytest.raises(CacheError, match="(?i)version-1 reranker.*retrain it") as err:
        read_info(_write_file(tmp_path / "old.npz", 1))
    assert "upgrade" not in str(err.value)


@pytest.mark.parametrize("version", [np.array([2, 2]), np.array("two")])
def test_a_damaged_version_is_a_cache_error(tmp_path: Path, version: object) -> None:
    with pytest.raises(CacheError, match="Cannot read the cache reranker"):
        read_info(_write_file(tmp_path / "bad.npz", version))
