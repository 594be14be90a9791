"""Damaged or hand-edited router folders are refused at load with a RouterFileError that names the
file and says what to do, never loaded to fail (or score NaN) at the first request. Before: text in
an array, a 0-d ``classes`` or ``gate_intercept`` gave a bare ValueError/TypeError; embedding
arrays of another width loaded and raised a numpy broadcast error when scoring; ``classes`` of shape
[3, 1] loaded and failed when scoring; topic arrays with no restarts loaded and scored NaN (a NaN
never reaches the threshold: every prompt stayed on the device); a router.json without its
"embedding" field was refused as "needs 17 features". Synthetic routers: no embedder needed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybridllm._exceptions import RouterFileError
from hybridllm.router.features import EMBEDDING_DIM, text_feature_matrix
from hybridllm.router.fit import fit_gain_scorer, fit_source_mixture
from hybridllm.router.router import Router, load_router

OPTS = {"k": 10, "topics": 4, "topic_mix": 0.5, "dims": 16}


def _data(n: int = 240, seed: int = 0):
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(n, EMBEDDING_DIM)).astype(np.float32)
    emb[: n // 2, 0] += 6.0
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    gain = (rng.random(n) < np.where(emb[:, 1] > 0, 0.7, 0.1)).astype(np.int64)
    x = np.concatenate([text_feature_matrix([f"question {i}" for i in range(n)]), emb], axis=1)
    return x, gain, emb


@pytest.fixture(scope="module")
def routers(tmp_path_factory):
    x, gain, emb = _data()
    ids = np.repeat([0, 1], len(gain) // 2)
    one = Router(scorer=fit_gain_scorer(x, gain, embeddings=emb, **OPTS), threshold=0.5)
    mix = Router(scorer=fit_source_mixture(x, gain, ids, emb, **OPTS), threshold=0.5)
    base = tmp_path_factory.mktemp("routers")
    return {"one": one.save(base / "one"), "mix": mix.save(base / "mix")}, emb[:3]


def _copy(src, dst, **changes):
    dst.mkdir()
    (dst / "router.json").write_bytes((src / "router.json").read_bytes())
    with np.load(src / "weights.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    for name, change in changes.items():
        arrays[name] = change(arrays[name])
    np.savez(dst / "weights.npz", **arrays)
    return dst


CASES = [
    # (router, array, change, words in the message)
    ("one", "mean", lambda a: np.array(["x"] * len(a)), "corrupt"),
    ("one", "classes", lambda a: a[0], "classes ()"),
    ("one", "classes", lambda a: a[:, None], "one class per row of coef"),
    ("one", "proj_mean", lambda a: a[:-1], "takes [383]-float vectors"),
    ("one", "centroids", lambda a: a[:0], "topic arrays"),
    ("one", "topic_gains", lambda a: a[:, :0], "topic arrays"),
    ("mix", "gate_intercept", lambda a: a[0], "corrupt"),
    ("mix", "gate_mean", lambda a: np.array(["x"] * len(a)), "corrupt"),
    ("mix", "expert1_classes", lambda a: a[:, None], "one class per row of coef"),
    ("mix", "expert0_proj_mean", lambda a: a[:-1], "-float vectors"),
]


@pytest.mark.parametrize(("which", "name", "change", "words"), CASES,
                         ids=[f"{w}-{n}-{i}" for i, (w, n, _, _) in enumerate(CASES)])
def test_damaged_weights_are_refused_at_load_naming_the_folder(routers, tmp_path, which, name, change, words):
    folders, emb = routers
    if name == "centroids":  # both topic arrays go together, as a hand edit that kept them in step
        folder = _copy(folders[which], tmp_path / "r", centroids=change, topic_gains=lambda a: a[:0])
    elif name == "topic_gains":
        folder = _copy(folders[which], tmp_path / "r", centroids=lambda a: a[:, :0], topic_gains=change)
    elif name.endswith("proj_mean"):  # the projection keeps in step (else its shape check speaks)
        proj = name.replace("proj_mean", "proj")
        folder = _copy(folders[which], tmp_path / "r", **{name: change, proj: lambda a: a[:, :-1]})
    else:
        folder = _copy(folders[which], tmp_path / "r", **{name: change})
    with pytest.raises(RouterFileError) as err:
        load_router(folder).score_texts(["hi", "a question", "x"], embeddings=emb)
    message = str(err.value)
    assert str(folder) in message and words in message, message
    assert "retrain" in message.lower() or "re-copy" in message, message


def test_whole_routers_still_load_and_score(routers):
    folders, emb = routers
    for folder in folders.values():
        scores = load_router(folder).score_texts(["hi", "a question", "x"], embeddings=emb)
        assert np.all((scores >= 0) & (scores <= 1))


def test_a_config_without_its_embedding_field_says_so(routers, tmp_path):
    folders, _ = routers
    folder = _copy(folders["one"], tmp_path / "r")
    config = json.loads((folder / "router.json").read_text())
    del config["embedding"]
    (folder / "router.json").write_text(json.dumps(config))
    with pytest.raises(RouterFileError, match="has no 'embedding' field") as err:
        load_router(folder)
    assert str(folder / "router.json") in str(err.value)
