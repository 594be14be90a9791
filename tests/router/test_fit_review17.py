"""Fitting the scorer and the source mixture on degenerate or invalid data: a RouterError that
says what to fix, never sklearn's error, an SVD's, or a router that scores NaN."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm._exceptions import RouterError
from hybridllm.router.fit import fit_gain_scorer, fit_source_mixture


def _data(n: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype(np.float32)
    emb = rng.normal(size=(n, 8)).astype(np.float32)
    gain = np.tile([1.0, 0.0], n // 2)
    return x, gain, emb


def test_nan_or_inf_features_name_the_rows() -> None:
    x, g, _ = _data()
    x[3, 2], x[7, 0] = np.nan, np.inf
    with pytest.raises(RouterError, match="rows 3, 7 hold NaN or inf"):
        fit_gain_scorer(x, g)


@pytest.mark.parametrize("bad", [np.nan, 2.0, 1.5, -np.inf])
def test_gain_nan_or_outside_minus_one_to_one_is_refused(bad: float) -> None:
    x, g, _ = _data()
    g[5] = bad
    with pytest.raises(RouterError, match="row 5 are NaN, inf or outside"):
        fit_gain_scorer(x, g)


def test_embeddings_of_other_rows_are_refused() -> None:
    # 39 embeddings for 40 rows fitted silently, each neighbor scored with another row's gain
    x, g, emb = _data()
    with pytest.raises(RouterError, match="Embeddings \\(39, 8\\) do not match the 40"):
        fit_gain_scorer(x, g, embeddings=emb[:-1])


def test_nan_embeddings_are_refused() -> None:
    x, g, emb = _data()
    emb[:] = np.nan
    with pytest.raises(RouterError, match="embeddings of rows 0, 1, 2, 3, 4 and 35 more"):
        fit_gain_scorer(x, g, embeddings=emb)


def test_k_zero_is_refused_not_nan_scores() -> None:
    x, g, emb = _data()
    with pytest.raises(RouterError, match="k 0"):
        fit_gain_scorer(x, g, embeddings=emb, k=0)


@pytest.mark.parametrize("c", [0.0, -1.0, float("nan")])
def test_c_not_positive_is_a_router_error(c: float) -> None:
    x, g, _ = _data()
    with pytest.raises(RouterError, match="Invalid scorer options: c"):
        fit_gain_scorer(x, g, c=c)


def test_weight_only_on_prompts_that_gain_alike_is_refused() -> None:
    x, g, _ = _data()
    with pytest.raises(RouterError, match="sample_weight leaves weight only"):
        fit_gain_scorer(x, g, sample_weight=(g == 0).astype(np.float64))


def test_zero_weights_on_some_rows_still_fit() -> None:
    x, g, _ = _data()
    w = np.ones(len(g))
    w[:10] = 0.0
    assert fit_gain_scorer(x, g, sample_weight=w).predict(x).shape == (len(g),)


def test_two_rows_fit() -> None:
    x, g, emb = _data()
    scores = fit_gain_scorer(x[:2], g[:2], embeddings=emb[:2]).predict(x[:2], emb[:2])
    assert np.all(np.isfinite(scores))


def test_mixture_nan_gain_in_a_constant_source_is_refused() -> None:
    # source 0 gains nothing anywhere but one NaN: its constant expert scored every prompt NaN
    x, g, emb = _data()
    ids = np.repeat([0, 1], 20)
    g[:20] = 0.0
    g[3] = np.nan
    with pytest.raises(RouterError, match="row 3 are NaN"):
        fit_source_mixture(x, g, ids, emb)


def test_mixture_of_one_source_says_so() -> None:
    x, g, emb = _data()
    with pytest.raises(RouterError, match="two or more sources"):
        fit_source_mixture(x, g, np.zeros(len(g), np.int64), emb)


@pytest.mark.parametrize("ids", [np.repeat([0.0, 0.5], 20), np.r_[np.repeat([0, 1], 20)[:-1], -1]])
def test_mixture_ids_not_whole_numbers_from_zero(ids: np.ndarray) -> None:
    x, g, emb = _data()
    with pytest.raises(RouterError, match="Source ids must be whole numbers"):
        fit_source_mixture(x, g, ids, emb)


@pytest.mark.parametrize("shares", [[1.0], [0.0, 1.0], [-1.0, 1.0], [float("inf"), 1.0]])
def test_mixture_bad_shares(shares: list[float]) -> None:
    x, g, emb = _data()
    with pytest.raises(RouterError, match="one positive, finite share per source"):
        fit_source_mixture(x, g, np.repeat([0, 1], 20), emb, shares=shares)


def test_mixture_rows_that_do_not_match() -> None:
    x, g, emb = _data()
    ids = np.repeat([0, 1], 20)
    with pytest.raises(RouterError, match="Embeddings \\(39, 8\\)"):
        fit_source_mixture(x, g, ids, emb[:-1])
    with pytest.raises(RouterError, match="one source id and one gain per row"):
        fit_source_mixture(x, g, ids[:-1], emb)
    with pytest.raises(RouterError, match="one source id and one gain per row"):
        fit_source_mixture(x[:0], g[:0], ids[:0], emb[:0])
