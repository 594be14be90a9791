"""The scorer's topic part: it learns per-cluster gains, survives a file round trip, and a broken or
older file is handled clearly. Synthetic embeddings, so no embedder is needed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybridllm._exceptions import RouterFileError
from hybridllm.router.classifier import TOPIC_RESTARTS
from hybridllm.router.features import EMBEDDING_DIM, TEXT_FEATURES, text_feature_matrix
from hybridllm.router.fit import fit_gain_scorer
from hybridllm.router.router import Router, load_router


def _topic_data(n_per: int = 120, n_topics: int = 4, seed: int = 0):
    """``n_topics`` tight clusters of unit vectors; topic t's prompts gain +1 with rate t / 4."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_topics, EMBEDDING_DIM))
    emb, gain = [], []
    for t in range(n_topics):
        e = centers[t] + 0.3 * rng.normal(size=(n_per, EMBEDDING_DIM))
        emb.append(e)
        gain.append((rng.random(n_per) < t / n_topics).astype(np.int64))
    emb_a = np.concatenate(emb).astype(np.float32)
    emb_a /= np.linalg.norm(emb_a, axis=1, keepdims=True)
    texts = [f"question number {i}" for i in range(len(emb_a))]
    x = np.concatenate([text_feature_matrix(texts), emb_a], axis=1)
    return x, np.concatenate(gain), emb_a, centers


def test_topic_gain_follows_cluster_rates():
    x, gain, emb, _ = _topic_data()
    scorer = fit_gain_scorer(x, gain, embeddings=emb, topics=4, topic_mix=1.0, k=10, mix=0.5)
    assert scorer.uses_topics and scorer.centroids is not None
    assert scorer.centroids.shape[:2] == (TOPIC_RESTARTS, 4)
    per_topic = [scorer.topic_gain(emb[t * 120:(t + 1) * 120]).mean() for t in range(4)]
    # rates 0, 0.25, 0.5, 0.75, shrunk a little toward the overall mean
    assert per_topic == sorted(per_topic)
    assert per_topic[0] < 0.1 and per_topic[3] > 0.6
    # with topic_mix 1 the score is the topic gain alone
    assert np.allclose(scorer.predict(x[:5], emb[:5]), (1 + scorer.topic_gain(emb[:5])) / 2, atol=1e-6)


def test_topics_off():
    x, gain, emb, _ = _topic_data()
    assert not fit_gain_scorer(x, gain, embeddings=emb, topics=0).uses_topics
    assert not fit_gain_scorer(x, gain, embeddings=emb, topic_mix=0.0).uses_topics
    # more clusters than prompts: no topic part rather than a k-means error
    few = slice(0, 480, 12)  # 40 prompts from every topic
    assert not fit_gain_scorer(x[few], gain[few], embeddings=emb[few], topics=60).uses_topics


@pytest.fixture
def topic_router(tmp_path):
    x, gain, emb, _ = _topic_data()
    scorer = fit_gain_scorer(x, gain, embeddings=emb, topics=4, k=10)
    router = Router(scorer=scorer, threshold=0.5, use_embedding=True)
    router.save(tmp_path / "r")
    return router, tmp_path / "r", emb


def test_round_trip_keeps_topic_scores(topic_router):
    router, folder, emb = topic_router
    texts = [f"question number {i}" for i in range(0, 480, 37)]
    loaded = load_router(folder)
    assert loaded.scorer.uses_topics
    want = router.score_texts(texts, embeddings=emb[0:480:37])
    assert np.allclose(loaded.score_texts(texts, embeddings=emb[0:480:37]), want, atol=1e-6)
    assert json.loads((folder / "router.json").read_text())["format_version"] == 2


def _rewrite(folder, change):
    with np.load(folder / "weights.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    change(arrays)
    np.savez(folder / "weights.npz", **arrays)


@pytest.mark.parametrize(
    "change",
    [
        lambda a: a.pop("topic_gains"),
        lambda a: a.update(centroids=a["centroids"][:, :, :7]),
        lambda a: a.update(topic_gains=a["topic_gains"][:, :2]),
        lambda a: a.update(topic_mix=np.asarray([1.5], np.float32)),
        lambda a: a.update(topic_gains=np.full_like(a["topic_gains"], np.nan)),
    ],
)
def test_broken_topic_arrays(topic_router, change):
    _, folder, _ = topic_router
    _rewrite(folder, change)
    with pytest.raises(RouterFileError, match="topic"):
        load_router(folder)


def test_version_1_file_without_topics_still_loads(tmp_path):
    x, gain, emb, _ = _topic_data()
    scorer = fit_gain_scorer(x, gain, embeddings=emb, topics=0, k=10)
    router = Router(scorer=scorer, threshold=0.5, use_embedding=True)
    router.save(tmp_path / "v1")
    cfg = json.loads((tmp_path / "v1" / "router.json").read_text())
    cfg.update(format_version=1, classifier="gain-logistic-knn")
    (tmp_path / "v1" / "router.json").write_text(json.dumps(cfg))
    loaded = load_router(tmp_path / "v1")
    assert not loaded.scorer.uses_topics
    texts = ["question number 3"]
    assert loaded.score_texts(texts, embeddings=emb[3:4]) == pytest.approx(
        router.score_texts(texts, embeddings=emb[3:4]))
    assert len(TEXT_FEATURES) + EMBEDDING_DIM == loaded.scorer.num_features
