"""The held-out QQP sample the shipped verifiers are measured on, embedded once per session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hybridllm.cache.evaluate import PairSet, embed_pairs, evaluate_pairs, load_pairs


@pytest.fixture(scope="session")
def held_out_qqp(shared_data: Path) -> tuple[PairSet, dict[str, np.ndarray]]:
    """3,000 pairs of the test split (never trained on) and their texts' vectors: the reranker's
    and the feature verifier's tests share both (embedding them was 45 s of CPU per call)."""
    from hybridllm.cache.train import split_of_pairs

    pairs = load_pairs(shared_data / "paraphrase" / "qqp_pairs.jsonl")
    test_idx = np.nonzero(split_of_pairs(pairs) == 2)[0]
    sample = np.random.default_rng(1).choice(test_idx, size=3000, replace=False)
    subset = PairSet(*([column[i] for i in sample] for column in (pairs.text_a, pairs.text_b, pairs.labels)))
    return subset, embed_pairs(subset)


@pytest.fixture(scope="session")
def features_on_held_out(held_out_qqp: tuple[PairSet, dict[str, np.ndarray]]) -> dict:
    """The feature verifier's metrics on :func:`held_out_qqp`, measured once for both tests."""
    subset, vectors = held_out_qqp
    return evaluate_pairs(subset, verifier="features", vectors=vectors)
