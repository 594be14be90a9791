"""Graded scores (a judge's marks, pass rates) and rows without a label: loading and training."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from hybridllm._exceptions import DataError, RouterError
from hybridllm.cli import main
from hybridllm.router.dataset import load_routellm_csv
from hybridllm.router.features import EMBEDDING_DIM, text_feature_matrix
from hybridllm.router.fit import fit_gain_scorer
from hybridllm.router.router import Router, load_router


def write(tmp_path, rows, name="d.csv"):
    p = tmp_path / name
    with p.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(rows)
    return p


def test_graded_columns_are_found_and_blank_rows_left_out(tmp_path):
    p = write(tmp_path, [
        ["prompt", "id", "small", "big"],
        ["q1", 7, 0.25, 0.75],
        ["q2", 8, "", 1.0],  # the weak answer was never scored
        ["q3", 9, 0.5, "NaN"],
        ["q4", 10, 1, 0.5],
    ])
    d = load_routellm_csv(p)  # "id" holds numbers above 1: not a score column
    assert (d.weak_col, d.strong_col) == ("small", "big")
    assert d.prompts == ["q1", "q4"] and d.skipped == 2
    assert list(d.weak) == [0.25, 1.0] and list(d.strong) == [0.75, 0.5]
    assert d.graded and list(d.labels) == [1, 0]


def test_true_false_columns_win_over_other_numbers_in_0_1(tmp_path):
    # a file that worked before graded scores: two True/False columns and a temperature column
    p = write(tmp_path, [
        ["prompt", "temperature", "a", "b"],
        ["q1", 0.7, "True", "False"],
        ["q2", 0.7, "True", "True"],
        ["q3", 0.7, "", "False"],
    ])
    d = load_routellm_csv(p)
    assert {d.weak_col, d.strong_col} == {"a", "b"} and not d.graded and d.skipped == 1


def test_judge_marks_need_their_scale(tmp_path):
    p = write(tmp_path, [["prompt", "small", "big"], ["q1", 3, 9], ["q2", 10, 1], ["q3", 1, 5.5]])
    with pytest.raises(DataError, match="--score-range"):
        load_routellm_csv(p)
    with pytest.raises(DataError, match=r"from 1 to 10, outside \[0, 1\].*--score-range"):
        load_routellm_csv(p, weak_col="small", strong_col="big")
    d = load_routellm_csv(p, score_range=(1, 10))
    assert (d.weak_col, d.strong_col) == ("small", "big")  # mean marks 4.67 and 5.17
    d = load_routellm_csv(p, weak_col="small", strong_col="big", score_range=(1, 10))
    assert np.allclose(d.weak, [2 / 9, 1.0, 0.0]) and np.allclose(d.strong, [8 / 9, 0.0, 0.5])
    with pytest.raises(DataError, match="LO < HI"):
        load_routellm_csv(p, score_range=(10, 1))
    with pytest.raises(DataError, match="not all scores"):
        load_routellm_csv(write(tmp_path, [["prompt", "a", "b"], ["q", "good", 1]], "w.csv"),
                          weak_col="a", strong_col="b")


def _graded_topics(n_per=120, seed=0):
    """Four tight clusters; topic t's prompts gain about 0.2 * t on average (graded, noisy)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(4, EMBEDDING_DIM))
    emb, gain = [], []
    for t in range(4):
        e = centers[t] + 0.3 * rng.normal(size=(n_per, EMBEDDING_DIM))
        emb.append(e)
        gain.append(np.clip(0.2 * t + 0.15 * rng.normal(size=n_per), -1, 1))
    emb_a = np.concatenate(emb).astype(np.float32)
    emb_a /= np.linalg.norm(emb_a, axis=1, keepdims=True)
    texts = [f"question number {i}" for i in range(len(emb_a))]
    x = np.concatenate([text_feature_matrix(texts), emb_a], axis=1)
    return texts, x, np.concatenate(gain), emb_a


def test_graded_gains_train_every_part_and_survive_the_file(tmp_path):
    texts, x, gain, emb = _graded_topics()
    scorer = fit_gain_scorer(x, gain, embeddings=emb, topics=4, k=10)
    # the linear part estimates the expected gain, not its sign: its mean is the data's mean gain
    assert scorer.linear_gain(x).mean() == pytest.approx(gain.mean(), abs=0.03)
    per_topic = [scorer.predict(x[t * 120:(t + 1) * 120], emb[t * 120:(t + 1) * 120]).mean()
                 for t in range(4)]
    assert per_topic == sorted(per_topic) and per_topic[3] - per_topic[0] > 0.2
    router = Router(scorer=scorer, threshold=0.5, use_embedding=True)
    router.save(tmp_path / "r")
    loaded = load_router(tmp_path / "r")
    # graded neighbor gains are stored as float16, not cut to integers
    assert np.allclose(loaded.score_texts(texts[::37], embeddings=emb[::37]),
                       router.score_texts(texts[::37], embeddings=emb[::37]), atol=2e-3)


def test_a_graded_file_without_variation_is_refused():
    texts, x, _, emb = _graded_topics(n_per=20)
    with pytest.raises(RouterError, match="nothing to learn"):
        fit_gain_scorer(x, np.full(len(x), 0.3), embeddings=emb)
    with pytest.raises(RouterError, match="nothing to learn"):
        fit_gain_scorer(x, -np.abs(np.linspace(0, 1, len(x))), embeddings=emb)


def _pairs(rng, n=400):
    """Long prompts need the strong model more often: learnable from the text features alone."""
    for i in range(n):
        k = int(rng.integers(1, 60))
        weak = rng.random() > (0.7 if k > 30 else 0.1)
        strong = rng.random() > 0.1
        yield f"q{i} " + "word " * k, weak, strong


def test_judge_marks_train_as_the_same_labels_would(tmp_path, capsys):
    """True/False labels written as a judge's 1 / 10 marks with --score-range 1,10 train the same
    router; graded marks with blanks train, report the rows left out, and evaluate."""
    rows = list(_pairs(np.random.default_rng(0)))
    plain = write(tmp_path, [["prompt", "small", "big"], *rows], "plain.csv")
    marks = write(tmp_path, [["prompt", "small", "big"],
                             *[[p, 10 if w else 1, 10 if s else 1] for p, w, s in rows]], "marks.csv")
    outs = []
    for path, extra in ((plain, []), (marks, ["--score-range", "1,10"])):
        out = tmp_path / path.stem
        args = ["router", "train", "--data", str(path), "--out", str(out), "--no-embedding", *extra]
        assert main(args) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0]["cv"] == outs[1]["cv"] and outs[0]["threshold"] == outs[1]["threshold"]

    rng = np.random.default_rng(1)
    graded = [["prompt", "small", "big"]]
    for p, w, s in rows:  # marks 1-10 with noise; every 20th row's weak mark is missing
        mark_w = int(np.clip(round(1 + 9 * w - rng.integers(0, 3)), 1, 10))
        mark_s = int(np.clip(round(1 + 9 * s - rng.integers(0, 3)), 1, 10))
        graded.append([p, "" if len(graded) % 20 == 0 else mark_w, mark_s])
    gpath = write(tmp_path, graded, "graded.csv")
    out = tmp_path / "g"
    assert main(["router", "train", "--data", str(gpath), "--out", str(out), "--no-embedding"]) == 1
    assert "--score-range" in capsys.readouterr().err
    assert main(["router", "train", "--data", str(gpath), "--out", str(out), "--no-embedding",
                 "--score-range", "1,10"]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert trained["skipped_rows"] == {"graded.csv": 20} and trained["cv"]["apgr"] > 0.6
    info = json.loads((out / "router.json").read_text())["training"]
    assert info["label"].startswith("graded") and "--score-range 1,10" in info["command"]
    assert main(["router", "eval", "--data", str(gpath), "--router", str(out), "--json",
                 "--score-range", "1,10"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["n"] == 380 and ev["skipped_rows"] == 20 and ev["apgr"] > ev["baselines"]["random"]["apgr"]
    with pytest.raises(SystemExit) as bad:  # argparse's usage error
        main(["router", "eval", "--data", str(gpath), "--router", str(out), "--score-range", "9,1"])
    assert bad.value.code == 2
    assert "LO must be below HI" in capsys.readouterr().err


def test_a_fold_without_a_quality_gap_does_not_stop_training(tmp_path, capsys):
    """A small file's fold can hold no prompt the strong model gets right more often: before,
    its per-fold figures raised "not more accurate ... swapped?" and the whole training failed."""
    from hybridllm.router.train import DEFAULT_FOLDS, fold_ids

    rows = list(_pairs(np.random.default_rng(2), n=200))
    folds = fold_ids([p for p, _, _ in rows], DEFAULT_FOLDS)
    rows = [(p, w, w if f == 3 else s) for (p, w, s), f in zip(rows, folds, strict=True)]
    path = write(tmp_path, [["prompt", "small", "big"], *rows], "small.csv")
    out = tmp_path / "r"
    assert main(["router", "train", "--data", str(path), "--out", str(out), "--no-embedding"]) == 0
    cv = json.loads(capsys.readouterr().out)
    assert cv["cv_per_fold"][3] == {"n": int(np.sum(folds == 3)), "no_gap": True}
    assert all("apgr" in m for i, m in enumerate(cv["cv_per_fold"]) if i != 3)
    assert cv["cv"]["n"] == 200 and cv["cv"]["apgr"] > 0.5


def test_training_reports_its_progress(tmp_path, capsys):
    """Every fit is counted (one per fold, then the final one) and embedding reports its prompts;
    the CLI turns both into bars on stderr for work over a second."""
    from hybridllm.cache.embedder import get_embedder
    from hybridllm.router.dataset import RoutingData
    from hybridllm.router.train import train_router

    rows = list(_pairs(np.random.default_rng(3), n=120))
    data = RoutingData([p for p, _, _ in rows], np.array([float(w) for _, w, _ in rows]),
                       np.array([float(s) for _, _, s in rows]), "small", "big")
    calls: list[tuple[int, int]] = []
    train_router(data, use_embedding=False, num_folds=4, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
    seen: list[tuple[int, int]] = []
    texts = [f"question {i} " + "word " * (i % 7) for i in range(70)]
    get_embedder().embed(texts, batch_size=32, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(32, 70), (64, 70), (70, 70)]
