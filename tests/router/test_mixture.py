"""Several labelled files with embeddings: a source mixture, one scorer per file blended by a gate
over the embedding, with a range test (synthetic embeddings, no embedder)."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm._exceptions import RouterFileError
from hybridllm.router.features import EMBEDDING_DIM, text_feature_matrix
from hybridllm.router.fit import fit_gain_scorer, fit_source_mixture
from hybridllm.router.mixture import SourceMixture

OPTS = {"k": 10, "topics": 4, "topic_mix": 0.5}


def _files(seed: int = 0):
    """Two files in two regions of the embedding that disagree: in file 0 the cloud is needed where
    axis 2 is positive, in file 1 where it is negative."""
    rng = np.random.default_rng(seed)
    n = 300
    emb = rng.normal(size=(2 * n, EMBEDDING_DIM)).astype(np.float32)
    emb[:n, 0] += 6.0
    emb[n:, 1] += 6.0
    emb[:, 2] += 4.0 * rng.choice([-1.0, 1.0], size=2 * n)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    ids = np.repeat([0, 1], n)
    side = emb[:, 2] > 0
    need = np.where(ids == 0, side, ~side)
    gain = (rng.random(2 * n) < np.where(need, 0.7, 0.05)).astype(np.int64)
    x = np.concatenate([text_feature_matrix([f"q{i}" for i in range(2 * n)]), emb], axis=1)
    return x, gain, emb, ids


def test_each_file_keeps_the_order_a_router_of_its_own_gives():
    """On a file's own prompts the mixture scores as a scorer fitted on that file alone; one scorer
    on the pooled rows does not (the other file's opposite rule leaks in)."""
    x, gain, emb, ids = _files()
    mix = fit_source_mixture(x, gain, ids, emb, **OPTS)
    for s in (0, 1):
        rows = ids == s
        alone = fit_gain_scorer(x[rows], gain[rows], embeddings=emb[rows], **OPTS)
        w = mix.weights(emb[rows])
        assert np.all(w[:, s] > 0.99)
        assert np.allclose(mix.predict(x[rows], emb[rows]), alone.predict(x[rows], emb[rows]), atol=0.01)
    pooled = fit_gain_scorer(x, gain, embeddings=emb, **OPTS)
    side = emb[:, 2] > 0
    # file 0: positive axis 2 needs the cloud; the mixture ranks that side higher by a wide margin
    f0 = ids == 0
    got = mix.predict(x[f0], emb[f0])
    assert got[side[f0]].mean() - got[~side[f0]].mean() > 0.15
    assert not np.allclose(pooled.predict(x[f0], emb[f0]), got, atol=0.01)


def test_a_prompt_out_of_every_files_range_goes_to_the_file_it_is_most_typical_of():
    """The gate is linear and says 'file 1' with certainty far along its direction; the range test
    keeps a prompt that is typical of no file from following it."""
    x, gain, emb, ids = _files()
    mix = fit_source_mixture(x, gain, ids, emb, **OPTS)
    coef = mix.gate_coef[1] - mix.gate_coef[0]
    far = (coef / mix.gate_scale).astype(np.float32)  # the gate's own direction toward file 1
    far /= np.linalg.norm(far)
    probe = 0.2 * far + emb[0]  # file 0's first prompt pushed toward file 1's side of the gate
    probe = (probe / np.linalg.norm(probe))[None, :]
    assert mix.gate(probe)[0, 1] > 0.9  # the gate alone says file 1
    pv, w = mix.in_range(probe)[0], mix.weights(probe)[0]
    assert pv[1] < 0.01 <= pv[0]  # but it is out of file 1's range and in file 0's
    assert w[0] == pytest.approx(1.0)
    # a prompt unlike both files: all weight on one file, the one it is most typical of
    odd = np.zeros((1, EMBEDDING_DIM), np.float32)
    odd[0, 5] = 1.0
    pv, w = mix.in_range(odd)[0], mix.weights(odd)[0]
    assert np.all(pv < 0.01) and w[int(np.argmax(pv))] == 1.0


def test_a_file_without_any_prompt_that_needs_the_cloud_gets_a_constant_expert():
    x, gain, emb, ids = _files()
    gain = np.where(ids == 1, 0, gain)
    mix = fit_source_mixture(x, gain, ids, emb, **OPTS)
    rows = ids == 1
    assert np.allclose(mix.experts[1].predict(x[rows], emb[rows]), 0.5)


def test_mixture_router_file_round_trip_and_refusals(tmp_path):
    from hybridllm.router.router import MIXTURE_FORMAT_VERSION, Router, load_router

    x, gain, emb, ids = _files()
    mix = fit_source_mixture(x, gain, ids, emb, **OPTS)
    Router(scorer=mix, threshold=0.55).save(tmp_path / "r")
    loaded = load_router(tmp_path / "r")
    assert isinstance(loaded.scorer, SourceMixture)
    import json

    config = json.loads((tmp_path / "r" / "router.json").read_text())
    assert config["format_version"] == MIXTURE_FORMAT_VERSION
    assert np.allclose(loaded.scorer.predict(x[:50], emb[:50]), mix.predict(x[:50], emb[:50]), atol=1e-3)
    with np.load(tmp_path / "r" / "weights.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    broken = dict(arrays, expert0_support=arrays["expert0_support"][::-1].copy())
    np.savez(tmp_path / "r" / "weights.npz", **broken)
    with pytest.raises(RouterFileError, match="not sorted"):
        load_router(tmp_path / "r")
    missing = {k: v for k, v in arrays.items() if k != "range_proj"}
    np.savez(tmp_path / "r" / "weights.npz", **missing)
    with pytest.raises(RouterFileError, match="incomplete"):
        load_router(tmp_path / "r")
