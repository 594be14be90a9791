"""A damaged or hand-edited router file whose scorer weights are finite but out of range is refused
at load with a RouterFileError naming the array, and finite weights never score NaN. Before: a
scale of 1e-30 or a gain of 5 loaded, and scored 0/1 or NaN (a NaN score never reaches the
threshold: all traffic stayed on the device). Routers built by hand: no embedder is needed."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm._exceptions import RouterFileError
from hybridllm.router.classifier import GainScorer
from hybridllm.router.features import EMBEDDING_DIM, TEXT_FEATURES
from hybridllm.router.router import Router, load_router

D = len(TEXT_FEATURES) + EMBEDDING_DIM


def _router() -> Router:
    """Linear, neighbor and topic parts over 8 projected dimensions, as fitted: unit axes, refs and
    centroids of norm <= 1, gains in [-1, 1]."""
    rng = np.random.default_rng(0)
    dims = 8
    refs = rng.normal(size=(20, dims)).astype(np.float32)
    refs /= np.linalg.norm(refs, axis=1, keepdims=True)
    proj = np.linalg.qr(rng.normal(size=(EMBEDDING_DIM, dims)))[0].T.astype(np.float32)
    scorer = GainScorer(
        mean=np.zeros(D, np.float32), scale=np.ones(D, np.float32),
        coef=np.zeros((3, D), np.float32), intercept=np.zeros(3, np.float32),
        classes=np.asarray([-1.0, 0.0, 1.0], np.float32),
        proj_mean=np.zeros(EMBEDDING_DIM, np.float32), proj=proj,
        refs=refs, ref_gains=rng.choice([-1.0, 0.0, 1.0], size=20).astype(np.float32), k=5, mix=0.8,
        centroids=(refs[:6].reshape(2, 3, dims) * 0.5).astype(np.float32),
        topic_gains=rng.uniform(-1, 1, size=(2, 3)).astype(np.float32), topic_mix=0.5,
    )
    return Router(scorer=scorer, threshold=0.5, use_embedding=True)


def _set(folder, name: str, value: float, *, every: bool = False) -> None:
    path = folder / "weights.npz"
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    bad = arrays[name].astype(np.float32)
    if every:
        bad[...] = value
    else:
        bad.flat[1] = value
    np.savez(path, **{**arrays, name: bad})


def test_the_router_as_fitted_loads(tmp_path):
    folder = _router().save(tmp_path / "r")
    emb = np.random.default_rng(1).normal(size=EMBEDDING_DIM).astype(np.float32)
    assert 0.0 <= load_router(folder).score_text("What is 2 + 2?", embedding=emb) <= 1.0


@pytest.mark.parametrize(
    ("name", "value", "every"),
    [
        ("scale", 1e-30, True),  # every feature divided by 1e-30: logits overflow float32
        ("scale", -1.0, False),  # a standard deviation is never negative
        ("classes", 5.0, False),
        ("ref_gains", 3.0, False),
        ("topic_gains", -2.0, False),
        ("proj", 1e30, False),
        ("proj_mean", 1e30, False),
        ("refs", 1e30, False),
        ("centroids", 1e30, False),
    ],
)
def test_out_of_range_weights_are_refused_naming_the_array(tmp_path, name, value, every):
    folder = _router().save(tmp_path / "r")
    _set(folder, name, value, every=every)
    with pytest.raises(RouterFileError) as err:
        load_router(folder)
    message = str(err.value)
    assert f"{name} " in message and "retrain" in message and "weights.npz" in message, message


def test_a_nan_names_its_array(tmp_path):
    folder = _router().save(tmp_path / "r")
    _set(folder, "intercept", np.nan)
    with pytest.raises(RouterFileError, match=r"NaN, inf or zero scales \(in intercept\)"):
        load_router(folder)


def test_huge_finite_linear_weights_score_a_number_not_nan():
    """Logits beyond float32 (+1e38 and -1e38 per feature) gave inf - inf = NaN."""
    d = len(TEXT_FEATURES)
    coef = np.zeros((2, d), np.float32)
    coef[0], coef[1] = -1e38, 1e38
    scorer = GainScorer(
        mean=np.zeros(d, np.float32), scale=np.ones(d, np.float32), coef=coef,
        intercept=np.zeros(2, np.float32), classes=np.asarray([-1.0, 1.0], np.float32),
    )
    x = np.full((1, d), 3.0, np.float32)
    with np.errstate(all="ignore"):
        got = scorer.predict(x)
    assert np.isfinite(got).all() and got[0] == 1.0
