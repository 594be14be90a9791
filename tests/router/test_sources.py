"""Training on several labelled files: pooling, source weights, per-source CV, the threshold that
keeps every source at 95% of its strong model (text-only, small files, no embedder)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from hybridllm.cli import main
from hybridllm.router.dataset import load_routellm_csv
from hybridllm.router.train import pool, train_from_csv


def _write(path, rows, cols=("small", "big")):
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["prompt", *cols])
        w.writerows(rows)
    return path


def _source(path, *, long_is_hard: bool, n: int, seed: int, tag: str, cols=("small", "big")):
    """Prompts of 1..60 words; the weak model fails on the long (or the short) half."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        words = int(rng.integers(1, 60))
        hard = (words > 30) == long_is_hard
        weak = rng.random() > (0.8 if hard else 0.05)
        rows.append([f"{tag}{i} " + "word " * words, weak, rng.random() > 0.05])
    return _write(path, rows, cols)


def test_pool_weighs_each_source_by_its_share(tmp_path):
    a = load_routellm_csv(_source(tmp_path / "a.csv", long_is_hard=True, n=300, seed=0, tag="a"))
    b = load_routellm_csv(_source(tmp_path / "b.csv", long_is_hard=True, n=60, seed=1, tag="b"))
    data, sources = pool([("a", a), ("b", b)])
    assert len(data.prompts) == 360 and data.edge_logprob is None
    w = sources.sample_weight()
    assert w is not None and w.mean() == pytest.approx(1.0)
    assert w[sources.ids == 0].sum() == pytest.approx(w[sources.ids == 1].sum())  # equal shares
    assert w[sources.ids == 1][0] == pytest.approx(5 * w[sources.ids == 0][0])
    _, sources = pool([("a", a), ("b", b)], [3.0, 1.0])
    w = sources.sample_weight()
    assert w[sources.ids == 0].sum() == pytest.approx(3 * w[sources.ids == 1].sum())
    assert pool([("a", a)])[1].sample_weight() is None  # one source: plain, as before


def test_the_weights_decide_which_source_wins(tmp_path):
    """Two sources that disagree (long prompts hard in one, short ones in the other): the
    heavier source decides which prompts score high."""
    a = _source(tmp_path / "a.csv", long_is_hard=True, n=300, seed=0, tag="a")
    b = _source(tmp_path / "b.csv", long_is_hard=False, n=300, seed=1, tag="b")
    long_p, short_p = "x " + "word " * 55, "x word word"

    def gap(weights):
        r = train_from_csv([a, b], tmp_path / "r", use_embedding=False, weights=weights, num_folds=2)
        return float(r.score_texts([long_p])[0] - r.score_texts([short_p])[0])

    assert gap([10.0, 1.0]) > 0.05
    assert gap([1.0, 10.0]) < -0.05


def test_per_source_cv_and_a_threshold_that_serves_every_source(tmp_path, capsys):
    """A source whose weak model is hopeless (everything needs the cloud) pulls the threshold
    down to where that source keeps 95% of its strong quality; the metrics are per source."""
    a = _source(tmp_path / "a.csv", long_is_hard=True, n=300, seed=0, tag="a")
    rng = np.random.default_rng(2)
    math = _write(
        tmp_path / "math.csv",
        [
            [
                f"m{i} compute " + "number " * int(rng.integers(35, 60)),
                rng.random() < 0.03,
                rng.random() < 0.7,
            ]
            for i in range(120)
        ],
        cols=("edge:s", "cloud:q"),
    )
    out = tmp_path / "r"
    assert (
        main(["router", "train", "--data", str(a), "--data", str(math), "--out", str(out), "--no-embedding"])
        == 0
    )
    got = json.loads(capsys.readouterr().out)
    assert set(got["cv_per_source"]) == {"a.csv", "math.csv"}
    assert got["cv_per_source"]["a.csv"]["apgr"] > 0.6
    cfg = json.loads((out / "router.json").read_text())
    assert [s["n"] for s in cfg["training"]["sources"]] == [300, 120]
    assert cfg["training"]["command"].count("--data") == 2
    from hybridllm.router.router import load_router

    router = load_router(out)
    m = load_routellm_csv(math)
    routed = np.where(router.score_texts(m.prompts) >= router.threshold, m.strong, m.weak)
    assert routed.mean() >= 0.95 * m.strong.mean() - 0.03  # in-sample, with the CV's slack

    capsys.readouterr()
    with pytest.raises(SystemExit) as rc:  # a usage error, as argparse's own: exit 2
        main(["router", "train", "--data", str(a), "--data", str(math), "--weight", "1",
              "--out", str(out), "--no-embedding"])
    assert rc.value.code == 2
    err = capsys.readouterr().err
    assert "hybridllm router train: error: give one --weight per --data" in err and "--help" in err


def test_source_weights_reach_the_topics_but_not_the_linear_part_beside_them():
    """With a topic part, the source shares weigh the topic means only: the linear part (400
    features) is fitted on the rows as they are, so a small file weighed up 50x cannot teach it
    that file's surface. Without topics the linear part is all there is and takes the weights."""
    from hybridllm.router.features import EMBEDDING_DIM, text_feature_matrix
    from hybridllm.router.fit import fit_gain_scorer

    rng = np.random.default_rng(3)
    emb = rng.normal(size=(400, EMBEDDING_DIM)).astype(np.float32)
    emb[:200, 0] += 4.0  # two regions
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    gain = (rng.random(400) < np.where(np.arange(400) < 200, 0.1, 0.4)).astype(np.int64)
    x = np.concatenate([text_feature_matrix([f"q {i}" for i in range(400)]), emb], axis=1)
    w = np.where(np.arange(400) < 200, 1.0, 20.0)  # the second region's file weighed up
    kw = {"embeddings": emb, "topics": 2, "topic_mix": 0.5, "k": 10}
    plain, weighted = fit_gain_scorer(x, gain, **kw), fit_gain_scorer(x, gain, sample_weight=w, **kw)
    assert np.allclose(plain.coef, weighted.coef) and np.allclose(plain.intercept, weighted.intercept)
    assert not np.allclose(plain.topic_gains, weighted.topic_gains)
    no_topics = {**kw, "topics": 0}
    assert not np.allclose(
        fit_gain_scorer(x, gain, **no_topics).coef,
        fit_gain_scorer(x, gain, sample_weight=w, **no_topics).coef,
    )


def test_threshold_is_the_out_of_fold_quantile(tmp_path):
    """The threshold sends each source's cross-validated calls_at_95 fraction of its out-of-fold
    scores (how unseen prompts score) to the cloud; the lowest over sources wins."""
    from hybridllm.router.features import feature_matrix
    from hybridllm.router.train import cross_validate, train_router

    a = load_routellm_csv(_source(tmp_path / "a.csv", long_is_hard=True, n=300, seed=0, tag="a"))
    b = load_routellm_csv(_source(tmp_path / "b.csv", long_is_hard=False, n=200, seed=1, tag="b"))
    data, sources = pool([("a", a), ("b", b)])
    router = train_router(data, use_embedding=False, sources=sources)
    x = feature_matrix(data.prompts, use_embedding=False)
    oof = cross_validate(data, x, None, sources=sources).oof_scores
    per_source = router.info["metrics"]["cv_per_source"]
    want = min(
        float(np.quantile(oof[sources.ids == i], 1.0 - per_source[n]["calls_at_95"]))
        for i, n in enumerate(sources.names)
    )
    assert router.threshold == pytest.approx(want)
    assert "out-of-fold" in router.info["training"]["threshold_rule"]
