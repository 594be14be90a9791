"""The neighbor part's top-k mean by a partition threshold (``classifier.top_k_mean``) gives the
figures of the mean over argpartition's picks, which it replaced for speed: argpartition took 13 of
the 63 s of a retrain of the shipped router."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm.router import classifier
from hybridllm.router.classifier import GainScorer, top_k_mean


def _picks_mean(sims: np.ndarray, gains: np.ndarray, k: int) -> np.ndarray:
    """The mean over argpartition's picks, as the neighbor part computed it before."""
    return gains[np.argpartition(-sims, k - 1, axis=1)[:, :k]].mean(axis=1)


def _sims(rows: int, m: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((rows, 16)).astype(np.float32)
    refs = rng.standard_normal((m, 16)).astype(np.float32)
    refs[m // 2 :] = refs[: m - m // 2]  # every ref twice: ties at any row's k-th similarity
    return z @ refs.T


@pytest.mark.parametrize("k", [1, 7, 50, 300])
def test_top_k_mean_is_the_mean_of_argpartitions_picks(k):
    """Bit for bit with integer gains, ties (copies of a prompt among the refs) included."""
    rng = np.random.default_rng(k)
    gains = rng.integers(-1, 2, 300).astype(np.float32)
    sims = _sims(200, 300, k)
    untied = rng.standard_normal((200, 300)).astype(np.float32)
    for s in (sims, untied):
        want = _picks_mean(s, gains, k)
        got = top_k_mean(s.copy(), gains, k)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_top_k_mean_leaves_nan_rows_to_argpartition():
    """A NaN similarity sorts above every number in a partition but last in argpartition of the
    negated row: such a row keeps argpartition's pick."""
    rng = np.random.default_rng(1)
    gains = rng.integers(-1, 2, 40).astype(np.float32)
    sims = rng.standard_normal((6, 40)).astype(np.float32)
    sims[0, :3] = np.nan
    sims[1, :] = np.nan
    np.testing.assert_array_equal(top_k_mean(sims, gains, 5), _picks_mean(sims, gains, 5))


def test_graded_gains_agree_to_float32_rounding():
    rng = np.random.default_rng(2)
    gains = rng.uniform(-1, 1, 500).astype(np.float16).astype(np.float32)
    sims = _sims(100, 500, 3)
    np.testing.assert_allclose(top_k_mean(sims, gains, 50), _picks_mean(sims, gains, 50), rtol=0, atol=1e-6)


def _scorer(refs: np.ndarray, gains: np.ndarray, k: int) -> GainScorer:
    d = refs.shape[1]
    return GainScorer(
        mean=np.zeros(1, np.float32), scale=np.ones(1, np.float32), coef=np.zeros((2, 1), np.float32),
        intercept=np.zeros(2, np.float32), classes=np.array([0.0, 1.0], np.float32),
        proj_mean=np.zeros(d, np.float32), proj=np.eye(d, dtype=np.float32), refs=refs,
        ref_gains=gains, k=k, mix=1.0,
    )


def test_batch_neighbor_gain_needs_no_argpartition_without_ties(monkeypatch):
    """The speed itself: a batch whose k-th similarities are not tied is scored without
    argpartition (before: one argpartition of [rows, m] per slice, 13 s of a 63 s retrain), in
    slices that reuse their buffers, to the same figures."""
    rng = np.random.default_rng(4)
    refs = rng.standard_normal((400, 8)).astype(np.float32)
    gains = rng.integers(-1, 2, 400).astype(np.float32)
    emb = rng.standard_normal((50, 8)).astype(np.float32)
    scorer = _scorer(refs, gains, 9)
    z = scorer._projected(emb)
    want = _picks_mean(z @ refs.T, gains, 9).astype(np.float64)

    def refused(*args, **kwargs):
        raise AssertionError("argpartition over a batch without ties")

    monkeypatch.setattr(np, "argpartition", refused)
    monkeypatch.setattr(classifier, "_NEIGHBOR_ROWS", 16)  # slices of 16, 16, 16 and 2
    np.testing.assert_array_equal(scorer.neighbor_gain(emb), want)


def test_batch_neighbor_gain_with_copied_refs_matches_the_picks(monkeypatch):
    """Copies of a training prompt among the refs (the shipped MMLU rows have some) tie rows at
    their k-th similarity; sliced or not, those rows score as argpartition picked."""
    rng = np.random.default_rng(5)
    refs = rng.standard_normal((300, 8)).astype(np.float32)
    refs[150:] = refs[:150]
    gains = rng.integers(-1, 2, 300).astype(np.float32)
    emb = rng.standard_normal((40, 8)).astype(np.float32)
    scorer = _scorer(refs, gains, 7)
    want = _picks_mean(scorer._projected(emb) @ refs.T, gains, 7).astype(np.float64)
    np.testing.assert_array_equal(scorer.neighbor_gain(emb), want)
    monkeypatch.setattr(classifier, "_NEIGHBOR_ROWS", 16)
    np.testing.assert_array_equal(scorer.neighbor_gain(emb), want)
