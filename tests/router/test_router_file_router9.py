"""Hand-edited and damaged router folders are refused with a RouterFileError that names the file and
the field, never loaded as a router that routes otherwise than the file says. Before: `true` and
`"0.5"` were taken as thresholds (float(True) is 1.0), `"format_version": true` read as version 1,
and a NaN in a source mixture's range refs loaded and silently moved prompts in or out of an
expert's range. Routers built by hand: no embedder is needed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybridllm._exceptions import RouterError, RouterFileError
from hybridllm.router.classifier import GainScorer
from hybridllm.router.features import EMBEDDING_DIM, TEXT_FEATURES
from hybridllm.router.mixture import SUPPORT_K, SourceMixture
from hybridllm.router.router import Router, load_router

from .fakes import length_router


def _edit(folder, **fields) -> None:
    path = folder / "router.json"
    config = json.loads(path.read_text())
    for name, value in fields.items():
        if value is KeyError:
            del config[name]
        else:
            config[name] = value
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("threshold", True),
        ("threshold", False),
        ("threshold", "0.5"),
        ("threshold", None),
        ("threshold", KeyError),
        ("threshold", [0.5]),
        ("threshold", 1.5),
        ("threshold", -0.1),
        ("logprob_threshold", True),
        ("logprob_threshold", "-1"),
        ("logprob_threshold", None),
        ("logprob_threshold", {"value": -1}),
    ],
)
def test_a_threshold_that_is_not_a_json_number_is_refused_naming_file_and_field(tmp_path, field, value):
    folder = length_router(0.4).save(tmp_path / "r")
    _edit(folder, **{field: value})
    with pytest.raises(RouterFileError) as err:
        load_router(folder)
    message = str(err.value)
    assert str(folder / "router.json") in message and repr(field) in message, message
    assert "set it to a number" in message, message


def test_format_version_true_is_not_version_1(tmp_path):
    folder = length_router().save(tmp_path / "r")
    _edit(folder, format_version=True)
    with pytest.raises(RouterFileError, match="format version True"):
        load_router(folder)


def test_numbers_as_json_writes_them_still_load(tmp_path):
    folder = length_router().save(tmp_path / "r")
    _edit(folder, threshold=1, logprob_threshold=-2)  # ints, as a hand edit may leave them
    router = load_router(folder)
    assert router.threshold == 1.0 and router.logprob_threshold == -2.0
    _edit(folder, logprob_threshold=KeyError)  # routers written before the cascade's calibration
    assert load_router(folder).logprob_threshold == -1.0


def test_router_refuses_a_bool_threshold_from_python():
    with pytest.raises(RouterError, match="threshold must be a number in"):
        Router(scorer=length_router().scorer, threshold=True, use_embedding=False)


# a source mixture -------------------------------------------------------------------------------
def _mixture_router() -> Router:
    """Two linear experts over text features + embedding, a flat gate and a range over 4 dims."""
    rng = np.random.default_rng(0)
    d, e, dims, m = len(TEXT_FEATURES) + EMBEDDING_DIM, EMBEDDING_DIM, 4, SUPPORT_K + 2

    def expert(sign: float) -> GainScorer:
        coef = np.zeros((2, d), np.float32)
        coef[1, TEXT_FEATURES.index("log_chars")] = sign
        return GainScorer(mean=np.zeros(d, np.float32), scale=np.ones(d, np.float32), coef=coef,
                          intercept=np.zeros(2, np.float32), classes=np.asarray([-1.0, 1.0], np.float32))

    refs = rng.normal(size=(2, m, dims)).astype(np.float32)
    refs /= np.linalg.norm(refs, axis=2, keepdims=True)
    mix = SourceMixture(
        experts=(expert(1.0), expert(-1.0)),
        gate_mean=np.zeros(e, np.float32), gate_scale=np.ones(e, np.float32),
        gate_coef=np.zeros((2, e), np.float32), gate_intercept=np.zeros(2, np.float32),
        range_mean=np.zeros(e, np.float32), range_proj=rng.normal(size=(dims, e)).astype(np.float32),
        range_refs=(refs[0], refs[1]),
        supports=tuple(np.sort(rng.uniform(0.2, 0.9, size=m)).astype(np.float32) for _ in range(2)),
    )
    return Router(scorer=mix, threshold=0.5, use_embedding=True)


def _damage(folder, name: str, value: float) -> None:
    path = folder / "weights.npz"
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    bad = arrays[name].copy()
    bad.reshape(-1)[3] = value
    np.savez(path, **{**arrays, name: bad})


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["expert0_range_refs", "expert1_range_refs"])
def test_a_mixture_whose_range_refs_hold_nan_or_inf_is_refused(tmp_path, name, value):
    folder = _mixture_router().save(tmp_path / "r")
    assert isinstance(load_router(folder).scorer, SourceMixture)  # whole, it loads
    _damage(folder, name, value)
    with pytest.raises(RouterFileError) as err:
        load_router(folder)
    message = str(err.value)
    assert str(folder / "weights.npz") in message and "range refs" in message, message
    assert "NaN or inf" in message and "retrain" in message, message


@pytest.mark.parametrize(
    ("name", "match"),
    [("expert1_support", "range in the router holds NaN or inf"), ("range_proj", "source gate"),
     ("gate_coef", "source gate"), ("expert0_coef", "NaN, inf or zero scales")],
)
def test_the_mixtures_other_arrays_with_nan_are_refused(tmp_path, name, match):
    folder = _mixture_router().save(tmp_path / "r")
    _damage(folder, name, np.nan)
    with pytest.raises(RouterFileError, match=match):
        load_router(folder)
