"""The shipped router on the real data: it retrains to the same metrics, its eval output has the
documented keys, and calibration holds on held-back prompts.

Embeddings of the 9,772 MMLU prompts are cached under ``$HYBRIDLLM_EMBEDDINGS_DIR``; the first
run on a fresh machine computes them (a few minutes on two cores), later runs read the cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hybridllm.router.calibrate import calibrate_threshold
from hybridllm.router.dataset import load_routellm_csv
from hybridllm.router.embedding_cache import cached_embeddings
from hybridllm.router.router import load_router
from hybridllm.router.train import Hyper, fold_ids, train_router

from .fakes import length_router


@pytest.fixture(scope="module")
def mmlu(shared_data):
    data = load_routellm_csv(shared_data / "routellm" / "mmlu_responses.csv")
    return data, cached_embeddings(data.prompts)


@pytest.fixture(scope="module")
def shipped():
    return load_router()


@pytest.fixture(scope="module")
def shipped_mmlu_scores(mmlu, shipped):
    """The shipped router's scores of the 9,772 MMLU prompts, measured once for the three tests
    that read them (each ``score_texts`` over them rebuilt the text features and neighbors)."""
    data, emb = mmlu
    scores = shipped.score_texts(data.prompts, embeddings=emb)
    scores.flags.writeable = False  # shared: no test may change another's figures
    return scores


def test_shipped_router_routes_mmlu_better_than_length_and_random(mmlu, shipped, shipped_mmlu_scores):
    """Measured, not read back from router.json: the shipped router's scores on the data it was
    trained on beat the length and random baselines, and its threshold splits the traffic."""
    from hybridllm.router.evaluate import length_baseline, random_baseline, router_metrics

    data, _ = mmlu
    assert shipped.info["training"]["command"].startswith("hybridllm router train --data")
    scores = shipped_mmlu_scores
    got = router_metrics(scores, data.weak, data.strong)
    assert got["n"] == len(data.prompts) == 9772
    assert got["apgr"] > length_baseline(data.prompts, data.weak, data.strong)["apgr"] + 0.05
    assert got["apgr"] > random_baseline(data.weak, data.strong)["apgr"] + 0.05
    assert 0.05 < float(np.mean(scores >= shipped.threshold)) < 0.95


def _shipped_sources(shared_data, shipped):
    """The labelled files the shipped router was trained on, as its training record names them."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    where = {"mmlu_responses.csv": shared_data / "routellm" / "mmlu_responses.csv"}
    names = [s["data"] for s in shipped.info["training"].get("sources", [])] or ["mmlu_responses.csv"]
    return [where.get(n, root / "bench" / "data" / n) for n in names]


def test_retrain_matches_shipped(mmlu, shipped, shipped_mmlu_scores, shared_data):
    from hybridllm.router.train import pool

    t = shipped.info["training"]
    paths = _shipped_sources(shared_data, shipped)
    parts = [(p.name, mmlu[0] if p.name == "mmlu_responses.csv" else load_routellm_csv(p)) for p in paths]
    given = [s["weight"] for s in t.get("sources", [])]
    data, sources = pool(parts, given if given and None not in given else None)
    embs = [mmlu[1] if n == "mmlu_responses.csv" else cached_embeddings(d.prompts) for n, d in parts]
    emb = np.concatenate(embs)
    hyper = Hyper(
        c=t["c"], k=t["k"], mix=t["mix"], dims=t["dims"], topics=t["topics"], topic_mix=t["topic_mix"]
    )
    root = Path(__file__).resolve().parents[2]
    cascade = [load_routellm_csv(root / "bench" / "data" / n) for n in t.get("cascade_data", [])]
    router = train_router(
        data, embeddings=emb, hyper=hyper, num_folds=t["num_folds"], sources=sources, cascade_data=cascade
    )
    # On the machine that trained it every figure agrees to 1e-4. On another CPU, ONNX Runtime's
    # fp32 kernels round in another order and the int8 embedder's activation codes can move by one
    # step, so scores move a little (seen on an AMD EPYC: APGR within 0.001, Spearman 0.998 with
    # the shipped scores). APGR integrates the whole cost/quality curve and barely moves;
    # cpt50/cpt80/calls_at_95 are where that curve first crosses a level, and where it runs flat a
    # tiny score change moves the crossing (there: cv cpt80 0.5834 vs 0.5934, train calls_at_95
    # 0.368 vs 0.375), so they get a wider slack. The embedder's integer sums are exact on every
    # CPU (uint8 weights, tests/cache/test_int8_exact.py); with int8 weights a CPU without VNNI
    # saturated them and a retrain there moved past these bounds (2026-12-02, AVX2 only: cv APGR
    # 0.6669 against 0.672, rank correlation 0.977). The router shipped now was trained on that
    # AVX2-only EPYC; an Intel Xeon with AVX-512 VNNI (2026-12-02) retrains it within these APGR and
    # crossing bounds with rank correlation 0.988, so the order is held to 0.98 (a router that
    # learned something else ranks far below: random scores give ~0). Random routing is ~0.49 APGR.
    for split in ("cv", "train"):
        got, want = router.info["metrics"][split], shipped.info["metrics"][split]
        assert got["apgr"] == pytest.approx(want["apgr"], abs=0.005), (split, "apgr")
        for key in ("cpt50", "cpt80", "calls_at_95"):
            assert got[key] == pytest.approx(want[key], abs=0.025), (split, key)
    ours = router.score_texts(data.prompts, embeddings=emb)
    # row by row as score_texts(data.prompts) scores them: a prompt's score is its own
    theirs = np.concatenate([
        shipped_mmlu_scores if n == "mmlu_responses.csv" else shipped.score_texts(d.prompts, embeddings=e)
        for (n, d), e in zip(parts, embs, strict=True)
    ])
    rank = lambda s: np.argsort(np.argsort(s))  # noqa: E731
    assert float(np.corrcoef(rank(ours), rank(theirs))[0, 1]) > 0.98  # the same order of prompts
    assert router.threshold == pytest.approx(shipped.threshold, abs=0.02)
    assert router.logprob_threshold == pytest.approx(shipped.logprob_threshold, abs=0.05)


def test_calibration_on_held_back_prompts(mmlu, shipped_mmlu_scores):
    data, _ = mmlu
    scores = shipped_mmlu_scores
    held = fold_ids(data.prompts, 2) == 1  # split by question: calibrate on one half
    for target in (0.1, 0.3, 0.6):
        t = calibrate_threshold(scores[~held], target)
        assert float(np.mean(scores[held] >= t)) == pytest.approx(target, abs=0.05)


def test_calibration_on_other_traffic(shared_data):
    lines = (shared_data / "routellm" / "gsm8k_train_questions.jsonl").read_text().splitlines()
    prompts = [json.loads(x)["question"] for x in lines[:4000]]
    router = length_router(pivot_chars=250)
    scores = router.score_texts(prompts)
    t = calibrate_threshold(scores[:2000], 0.3)
    assert float(np.mean(scores[2000:] >= t)) == pytest.approx(0.3, abs=0.05)


def test_eval_cli_json(shared_data, capsys):
    from hybridllm.cli import main

    csv_path = shared_data / "routellm" / "mmlu_responses.csv"
    assert main(["router", "eval", "--data", str(csv_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("apgr", "cpt50", "cpt80", "calls_at_95", "n"):
        assert key in out
    assert out["n"] == 9772 and out["trained_on_this_data"] is True
    assert out["baselines"]["random"]["apgr"] == pytest.approx(0.5, abs=0.02)
    assert out["apgr"] > out["baselines"]["length"]["apgr"]


@pytest.mark.real
def test_shipped_router_scores_with_the_real_embedder(shipped):
    """The real embedder's score of a hard exam question is higher than a trivia question's,
    route() agrees with score() and the threshold, and a reused embedding scores the same."""
    from hybridllm.router.features import embed_one

    easy = [{"role": "user", "content": "What is the capital of France?"}]
    hard = [
        {
            "role": "user",
            "content": (
                "Which of the following best describes the role of the Krebs cycle in cellular "
                "respiration? A. glycolysis B. oxidation of acetyl-CoA C. fermentation "
                "D. photosynthesis"
            ),
        }
    ]
    route, score = shipped.route(easy)
    assert route == ("cloud" if score >= shipped.threshold else "edge")
    assert shipped.score(hard) > score
    vec = embed_one("What is the capital of France?")
    assert shipped.score_text("What is the capital of France?", embedding=vec) == pytest.approx(
        score, abs=1e-6
    )


@pytest.mark.real
def test_shipped_router_sends_the_demos_word_problem_to_the_cloud(shipped):
    """What `make run` relies on to show a real fallback: its GSM8K-style word problem scores at or
    above the shipped threshold (the router learned the 135M edge cannot do such problems), while
    a trivia question stays on the device."""
    from hybridllm import demo

    assert shipped.route(demo.WHILE_DOWN)[0] == "cloud"
    assert shipped.route("What is the capital of France?")[0] == "edge"


def test_batch_scores_are_the_run_time_scores(shipped, shared_data):
    """``score_texts`` (train, eval, calibrate) and ``score`` (each request) give one prompt the
    same score: a threshold calibrated on a file is the one live traffic meets."""
    lines = (shared_data / "routellm" / "gsm8k_train_questions.jsonl").read_text().splitlines()
    prompts = [json.loads(x)["question"] for x in lines[:40]] + ["hi", "What is the capital of France?"]
    batch = shipped.score_texts(prompts)
    one = np.array([shipped.score(p) for p in prompts])
    np.testing.assert_allclose(batch, one, rtol=0, atol=1e-6)  # float32 BLAS: batch vs one row
