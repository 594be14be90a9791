"""A source-mixture router file whose gate or range arrays are finite but out of any range the fit
writes is refused at load with a RouterFileError naming the array, and finite gate weights never
score NaN. Before: a gate_scale of 1e-30 loaded and sent every prompt wholly to one expert (by the
sign of one dimension), a gate coef of 3e38 scored NaN (which never reaches the threshold), a range
ref of 100 or a support of 5 moved prompts in or out of an expert's range without a word. Routers
built by hand: no embedder is needed."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm._exceptions import RouterFileError
from hybridllm.router.classifier import GainScorer
from hybridllm.router.features import EMBEDDING_DIM, TEXT_FEATURES
from hybridllm.router.mixture import SUPPORT_K, SourceMixture
from hybridllm.router.router import Router, load_router

D, E, DIMS, M = len(TEXT_FEATURES) + EMBEDDING_DIM, EMBEDDING_DIM, 4, SUPPORT_K + 6


def _expert(gain: float) -> GainScorer:
    """A constant expert: every prompt scores (1 + gain) / 2."""
    return GainScorer(mean=np.zeros(D, np.float32), scale=np.ones(D, np.float32),
                      coef=np.zeros((1, D), np.float32), intercept=np.zeros(1, np.float32),
                      classes=np.asarray([gain], np.float32))


def _mixture(**gate) -> SourceMixture:
    """Expert 0 scores 0.1, expert 1 0.9; a gate leaning on embedding dimension 0, as fitted: unit
    axes, unit refs, supports that take every prompt into both experts' ranges."""
    rng = np.random.default_rng(0)
    refs = rng.normal(size=(2, M, DIMS)).astype(np.float32)
    refs /= np.linalg.norm(refs, axis=2, keepdims=True)
    proj = np.linalg.qr(rng.normal(size=(E, DIMS)))[0].T.astype(np.float32)
    coef = np.zeros((2, E), np.float32)
    coef[1, 0] = 1.0
    arrays = {"gate_mean": np.zeros(E, np.float32), "gate_scale": np.ones(E, np.float32),
              "gate_coef": coef, "gate_intercept": np.zeros(2, np.float32), **gate}
    return SourceMixture(experts=(_expert(-0.8), _expert(0.8)), **arrays,
                         range_mean=np.zeros(E, np.float32), range_proj=proj,
                         range_refs=(refs[0], refs[1]),
                         supports=tuple(np.full(M, -1.0, np.float32) for _ in range(2)))


def _emb(sign: float) -> np.ndarray:
    v = np.zeros(E, np.float32)
    v[0], v[1] = 0.6 * sign, 0.8
    return v


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


def test_the_mixture_as_built_loads_and_its_gate_follows_the_embedding(tmp_path):
    folder = Router(scorer=_mixture(), threshold=0.5, use_embedding=True).save(tmp_path / "r")
    router = load_router(folder)
    lo = router.score_text("What is 2 + 2?", embedding=_emb(-1.0))
    hi = router.score_text("What is 2 + 2?", embedding=_emb(1.0))
    assert 0.1 < lo < 0.5 < hi < 0.9


@pytest.mark.parametrize(
    ("name", "value", "every"),
    [
        ("gate_scale", 1e-30, True),  # every dimension divided by 1e-30: the gate is one-hot
        ("gate_scale", 1e-38, True),  # near float32's smallest normal number
        ("gate_scale", 1e-12, False),  # below the fit's floor of 1e-8: that dimension decides
        ("gate_scale", -1.0, False),  # a standard deviation is never negative
        ("gate_mean", 1e30, False),
        ("range_mean", 1e30, False),
        ("range_proj", 1e30, False),  # projections overflow: the range test sees NaN
        ("expert0_range_refs", 100.0, False),  # float16 on disk: 1e6 would be inf
        ("expert1_support", 5.0, True),  # still sorted: every prompt out of expert 1's range
    ],
)
def test_a_gate_or_range_array_out_of_the_fits_range_is_refused_naming_it(tmp_path, name, value, every):
    folder = Router(scorer=_mixture(), threshold=0.5, use_embedding=True).save(tmp_path / "r")
    _set(folder, name, value, every=every)
    with pytest.raises(RouterFileError) as err:
        load_router(folder)
    message = str(err.value)
    assert name in message and "retrain" in message and str(folder / "weights.npz") in message, message


def test_a_nan_in_the_gate_names_its_array(tmp_path):
    folder = Router(scorer=_mixture(), threshold=0.5, use_embedding=True).save(tmp_path / "r")
    _set(folder, "gate_intercept", np.nan)
    with pytest.raises(RouterFileError, match=r"source gate holds NaN or inf \(in gate_intercept\)"):
        load_router(folder)


def test_gate_weights_near_float32s_limit_score_as_in_float64(tmp_path):
    """A gate coef of 3e38 on two dimensions overflowed the float32 logit to inf, and inf - inf gave
    every weight NaN: the score was NaN. Redone in float64, the gate is certain of expert 1."""
    coef = np.zeros((2, E), np.float32)
    coef[1, :2] = 3e38
    mix = _mixture(gate_coef=coef)
    w = mix.gate(_emb(1.0))
    assert np.all(np.isfinite(w)) and w[0, 1] == pytest.approx(1.0)
    folder = Router(scorer=mix, threshold=0.5, use_embedding=True).save(tmp_path / "r")
    score = load_router(folder).score_text("What is 2 + 2?", embedding=_emb(1.0))
    assert score == pytest.approx(0.9)


def test_the_scales_the_fit_writes_still_load(tmp_path):
    """The fit's floor: a standard deviation of 1e-8 in float32 (just below), and 1 for a constant
    column; the shipped router's gate holds 1.04e-8."""
    scale = np.ones(E, np.float32)
    scale[3], scale[4] = np.float32(1e-8), np.float32(1.0441509e-08)
    folder = Router(scorer=_mixture(gate_scale=scale), threshold=0.5, use_embedding=True).save(tmp_path / "r")
    assert isinstance(load_router(folder).scorer, SourceMixture)


def test_a_gate_mean_of_the_wrong_shape_is_refused(tmp_path):
    """A gate_mean of shape [e, 1] loaded (its first dimension matched), then broadcast one prompt
    into e rows of gate weights, and a batch raised numpy's ValueError at score time."""
    folder = Router(scorer=_mixture(), threshold=0.5, use_embedding=True).save(tmp_path / "r")
    path = folder / "weights.npz"
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    np.savez(path, **{**arrays, "gate_mean": arrays["gate_mean"].reshape(E, 1)})
    with pytest.raises(RouterFileError, match="do not match"):
        load_router(folder)


def test_an_experts_damaged_array_is_named_with_the_experts_prefix(tmp_path):
    """The expert's own checks name its array ``scale``; in a mixture file it is ``expert1_scale``."""
    folder = Router(scorer=_mixture(), threshold=0.5, use_embedding=True).save(tmp_path / "r")
    _set(folder, "expert1_scale", 1e-30)
    with pytest.raises(RouterFileError, match=r"Expert 1 \(arrays expert1_\*\): .*scale holds 1e-30"):
        load_router(folder)
