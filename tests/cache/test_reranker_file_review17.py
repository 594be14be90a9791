"""A reranker file's decision fields are range-checked when it is read: a damaged threshold,
min_similarity or stack is a CacheError naming the file, not a cache that serves any candidate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hybridllm._exceptions import CacheError
from hybridllm.cache.features import NUM_HANDCRAFTED
from hybridllm.cache.reranker_file import FORMAT, VERSION, read_info

N = 2 + NUM_HANDCRAFTED  # the stack's inputs: the reranker's logit, the feature verifier's, the features


def _write(path: Path, *, threshold: float = 0.9, min_similarity: float = 0.5, **stack: np.ndarray) -> Path:
    arrays = {
        "format": np.array(FORMAT), "version": np.array(VERSION), "threshold": np.array(threshold),
        "min_similarity": np.array(min_similarity), "weights_digest": np.array("0123456789abcdef"),
    }
    if stack:
        arrays.update({"stack_b": np.array(0.0), "features_digest": np.array("fedcba9876543210")})
        arrays.update({f"stack_{k}": v for k, v in stack.items()})
    np.savez(path, **arrays)
    return path


def _stack(**changes: np.ndarray) -> dict[str, np.ndarray]:
    return {"w": np.ones(N), "mean": np.zeros(N), "scale": np.ones(N), **changes}


def test_a_sound_file_is_read(tmp_path: Path) -> None:
    info = read_info(_write(tmp_path / "ok.npz", threshold=1.0, min_similarity=-1.0, **_stack()))
    assert (info.threshold, info.min_similarity) == (1.0, -1.0)
    assert info.stack is not None and info.stack.weights.shape == (N,)


@pytest.mark.parametrize(
    "fields",
    [
        {"threshold": float("nan")},
        {"threshold": 0.0},
        {"threshold": -0.5},
        {"threshold": 1.5},
        {"threshold": float("inf")},
        {"min_similarity": float("nan")},
        {"min_similarity": 1.5},
        {"min_similarity": -2.0},
    ],
    ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()),
)
def test_a_threshold_or_min_similarity_out_of_range_is_refused(tmp_path: Path, fields: dict) -> None:
    """Before: read as they were; a NaN min_similarity let every candidate through the cosine
    stage, and a file with NaN in both was read without a word."""
    path = _write(tmp_path / "bad.npz", **fields)
    with pytest.raises(CacheError, match="damaged") as err:
        read_info(path)
    assert str(path) in str(err.value)
    assert next(iter(fields)) in str(err.value)


@pytest.mark.parametrize(
    "stack",
    [
        _stack(scale=np.r_[0.0, np.ones(N - 1)]),  # an infinite logit: probability 1 for any pair
        _stack(scale=np.r_[-1.0, np.ones(N - 1)]),
        _stack(w=np.r_[np.nan, np.ones(N - 1)]),
        _stack(mean=np.r_[np.inf, np.zeros(N - 1)]),
        _stack(w=np.ones(N - 1)),  # a raw einsum ValueError on every lookup before
        _stack(scale=np.ones((1, N))),
    ],
    ids=["zero-scale", "negative-scale", "nan-weight", "inf-mean", "short-weights", "2d-scale"],
)
def test_a_damaged_stack_is_refused(tmp_path: Path, stack: dict) -> None:
    path = _write(tmp_path / "bad.npz", **stack)
    with pytest.raises(CacheError, match="damaged.*stack") as err:
        read_info(path)
    assert str(path) in str(err.value)
