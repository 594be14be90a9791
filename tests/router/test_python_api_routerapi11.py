"""The router from Python, as a RouteLLM user calls it: calibrate on a sample of traffic, score
lists, pass embeddings, load hand-edited or damaged router folders. No embedder is needed: the
routers here are built by hand (text features only, or with a small neighbor and topic part that
is handed its embeddings)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybridllm._exceptions import DataError, InvalidRequestError, RouterFileError
from hybridllm.router.calibrate import calibrate_threshold
from hybridllm.router.classifier import GainScorer
from hybridllm.router.features import EMBEDDING_DIM, TEXT_FEATURES
from hybridllm.router.router import Router, load_router

from .fakes import length_router

# 20 prompts of 20..400 characters: the length router ranks them by length
TRAFFIC = [f"Question {i}: " + "x" * (20 * i) for i in range(1, 21)]


def _embedding_router(threshold: float = 0.5) -> Router:
    """A router with neighbor and topic parts over 8 projected dimensions (random, fixed seed)."""
    rng = np.random.default_rng(0)
    d, dims = len(TEXT_FEATURES) + EMBEDDING_DIM, 8
    refs = rng.normal(size=(20, dims)).astype(np.float32)
    refs /= np.linalg.norm(refs, axis=1, keepdims=True)
    scorer = GainScorer(
        mean=np.zeros(d, np.float32), scale=np.ones(d, np.float32),
        coef=np.zeros((2, d), np.float32), intercept=np.zeros(2, np.float32),
        classes=np.asarray([-1.0, 1.0], np.float32),
        proj_mean=np.zeros(EMBEDDING_DIM, np.float32),
        proj=rng.normal(size=(dims, EMBEDDING_DIM)).astype(np.float32),
        refs=refs, ref_gains=rng.choice([-1.0, 0.0, 1.0], size=20).astype(np.float32), k=5, mix=0.8,
        centroids=rng.normal(size=(2, 3, dims)).astype(np.float32),
        topic_gains=rng.uniform(-1, 1, size=(2, 3)).astype(np.float32), topic_mix=0.5,
    )
    return Router(scorer=scorer, threshold=threshold, use_embedding=True)


def _unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=EMBEDDING_DIM).astype(np.float32)
    return v / np.linalg.norm(v)


# calibration from Python ------------------------------------------------------------------------
def test_calibrated_sends_the_wanted_share_and_leaves_the_router_alone(tmp_path):
    router = length_router(0.5, pivot_chars=100)
    # strings and conversations alike: a conversation is scored on its last user turn
    traffic = TRAFFIC[:10] + [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": p}]
                              for p in TRAFFIC[10:]]
    tuned = router.calibrated(traffic, 0.2)
    assert router.threshold == 0.5  # the original is untouched
    routes = [tuned.route(p)[0] for p in traffic]
    assert routes.count("cloud") == 4
    assert all(tuned.route(p)[0] == "cloud" for p in TRAFFIC[-4:])  # the four longest
    tuned.save(tmp_path / "r")
    assert load_router(tmp_path / "r").threshold == pytest.approx(tuned.threshold)


@pytest.mark.parametrize(("fraction", "cloud"), [(0.0, 0), (1.0, 20)])
def test_calibrated_ends_are_exact(fraction, cloud):
    tuned = length_router().calibrated(TRAFFIC, fraction)
    assert [tuned.route(p)[0] for p in TRAFFIC].count("cloud") == cloud


@pytest.mark.parametrize(
    ("prompts", "fraction", "match"),
    [
        (TRAFFIC, 1.5, "cloud_fraction must be a number between 0 and 1"),
        (TRAFFIC, True, "cloud_fraction"),
        (TRAFFIC, "0.2", "cloud_fraction"),
        ("one long string of traffic", 0.2, "list of prompts"),
        ([], 0.2, "empty"),
        (["fine", "  "], 0.2, r"prompts\[1\]: The prompt is empty"),
        (["fine", [{"role": "system", "content": "only a system turn"}]], 0.2, r"prompts\[1\]"),
    ],
)
def test_calibrated_refuses_bad_input(prompts, fraction, match):
    with pytest.raises(InvalidRequestError, match=match):
        length_router().calibrated(prompts, fraction)


def test_calibrate_threshold_speaks_python_and_refuses_nan_scores():
    with pytest.raises(DataError, match="^cloud_fraction must be"):
        calibrate_threshold([0.1, 0.2], 2.0)
    with pytest.raises(DataError, match="NaN"):
        calibrate_threshold([0.1, float("nan"), 0.3, 0.4], 0.25)


# scoring ----------------------------------------------------------------------------------------
def test_score_texts_refuses_one_string():
    """A string is a sequence of characters: it was scored as one prompt per character."""
    with pytest.raises(InvalidRequestError, match=r"score\(\)"):
        length_router().score_texts("What is the capital of France?")


@pytest.mark.parametrize(
    ("embedding", "match"),
    [
        (np.zeros(10, np.float32), "shape"),
        (np.zeros((2, EMBEDDING_DIM), np.float32), "shape"),
        (np.full(EMBEDDING_DIM, np.nan, np.float32), "NaN"),
    ],
)
def test_a_wrong_embedding_is_refused(embedding, match):
    router = _embedding_router()
    assert 0.0 <= router.score_text("hello", embedding=_unit(1)) <= 1.0
    with pytest.raises(InvalidRequestError, match=match):
        router.score_text("hello", embedding=embedding)
    with pytest.raises(InvalidRequestError, match=match):
        router.score_texts(["hello"], embeddings=embedding)


# loading ----------------------------------------------------------------------------------------
def _edit_weights(folder, **changes):
    with np.load(folder / "weights.npz", allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    for name, edit in changes.items():
        arrays[name] = edit(arrays[name])
    np.savez(folder / "weights.npz", **arrays)


def _nan_at_first(a):
    a = a.astype(np.float32)
    a.reshape(-1)[0] = np.nan
    return a


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"refs": _nan_at_first}, "NaN"),
        ({"ref_gains": _nan_at_first}, "NaN"),
        ({"proj": _nan_at_first}, "NaN"),
        ({"proj_mean": _nan_at_first}, "NaN"),
        ({"k": lambda a: np.asarray([0], np.int64)}, "k 0"),
        ({"k": lambda a: np.asarray([], np.int64)}, "'k' should hold one finite number"),
        ({"mix": lambda a: np.asarray([np.nan], np.float32)}, "'mix' should hold one finite number"),
        ({"mix": lambda a: np.asarray([5.0], np.float32)}, "mix 5"),
        ({"topic_mix": lambda a: np.asarray([], np.float32)}, "'topic_mix'"),
    ],
)
def test_damaged_weights_are_refused_naming_the_file(tmp_path, changes, match):
    router = _embedding_router()
    folder = router.save(tmp_path / "r")
    vec = _unit(2)
    assert load_router(folder).score_text("hi", embedding=vec) == router.score_text("hi", embedding=vec)
    _edit_weights(folder, **changes)
    with pytest.raises(RouterFileError, match=match) as err:
        load_router(folder)
    assert "weights.npz" in str(err.value) and "retrain" in str(err.value)


@pytest.mark.parametrize(("key", "value"), [("threshold", 2.0), ("logprob_threshold", float("nan"))])
def test_hand_edited_thresholds_are_refused_naming_the_file(tmp_path, key, value):
    folder = length_router().save(tmp_path / "r")
    config = json.loads((folder / "router.json").read_text(encoding="utf-8"))
    config[key] = value  # json writes NaN, and reads it back
    (folder / "router.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(RouterFileError, match="router.json"):
        load_router(folder)


def test_a_path_with_tilde_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    length_router(0.37).save(tmp_path / "my-router")
    assert load_router("~/my-router").threshold == pytest.approx(0.37)
    assert load_router("~/my-router/router.json").threshold == pytest.approx(0.37)
