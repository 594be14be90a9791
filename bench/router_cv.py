"""How much the router's cross-validated figures depend on the fold assignment, for the shipped
settings and for the previous design (neighbors plus linear, no topic part), in one run.

    python -m bench.router_cv [--json] [--salts 5] [--sources] [--curve]

One 5-fold CV with the shipped folds (a hash of the prompt) plus ``--salts`` more with the hash
salted, each fold still by question. Prints per-assignment ``calls_at_95`` and APGR, their means,
and ``calls_ratio`` = shipped mean / previous mean (below 1: fewer cloud calls at 95% quality).
``--sources`` adds the shipped multi-file training (MMLU plus our pair's GSM8K labels, as
``router train`` fits them: a source mixture) and reports its figures on the MMLU rows, the
issue's measure, and on the GSM8K rows, under the same fold assignments. ``--curve`` adds, for the
shipped design on MMLU: 5-fold CV with the training folds cut to half and three quarters, 10- and
20-fold CV, and the spread of APGR and calls at 95% over 200 random test sets of 4,270 questions
(the size of the 30% of RouteLLM's MMLU file that ``../shared`` does not hold) drawn from the
20-fold out-of-fold scores: how far one held-out figure can sit from the cross-validated one.
Needs ../shared/data/routellm/mmlu_responses.csv; the embeddings come from the router's cache.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hybridllm._cli_options import non_negative_int

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "routellm" / "mmlu_responses.csv"
GSM8K = ROOT / "bench" / "data" / "gsm8k_smollm2-135m_vs_qwen2.5-coder-1.5b.csv"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object only")
    ap.add_argument("--salts", type=non_negative_int, default=5,
                    help="salted fold assignments beside the shipped one (default 5)")
    ap.add_argument("--sources", action="store_true", help="also MMLU + our GSM8K labels, as shipped")
    ap.add_argument("--curve", action="store_true", help="also training rows, folds and test-set spread")
    args = ap.parse_args(argv)
    if not DATA.is_file():
        sys.stderr.write(f"{DATA} is missing; this benchmark needs ../shared/data.\n")
        return 2

    from hybridllm.router import train
    from hybridllm.router.dataset import load_routellm_csv
    from hybridllm.router.embedding_cache import cached_embeddings
    from hybridllm.router.features import feature_matrix

    data = load_routellm_csv(DATA)
    emb = cached_embeddings(data.prompts)
    x = feature_matrix(data.prompts, use_embedding=True, embeddings=emb)
    designs = {"shipped": train.Hyper(), "previous": train.Hyper(k=100, mix=0.7, dims=64, topics=0)}
    out: dict[str, Any] = {}
    for name, hyper in designs.items():
        runs = []
        for i, salt in enumerate(_salts(args.salts)):
            m = train.cross_validate(data, x, emb, hyper=hyper, fold_salt=salt).metrics
            runs.append(m)
            if not args.json:
                print(f"{name:9s} folds {i}: calls_at_95 {m['calls_at_95']:.4f} apgr {m['apgr']:.4f}",
                      flush=True)
        out[name] = _summary(runs)
    out["calls_ratio"] = round(out["shipped"]["calls_at_95_mean"] / out["previous"]["calls_at_95_mean"], 3)
    if args.sources:
        out["sources"] = _sources(args, data, emb, x)
    if args.curve:
        out["curve"] = _curve(data, emb, x)
    out["num_assignments"] = args.salts + 1
    print(json.dumps(out))
    return 0


def _sources(args: argparse.Namespace, mmlu: Any, emb: np.ndarray, x: np.ndarray) -> dict[str, Any]:
    """MMLU + our GSM8K labels trained as shipped; each assignment's figures on each file's rows."""
    from hybridllm.router import train
    from hybridllm.router.dataset import load_routellm_csv
    from hybridllm.router.embedding_cache import cached_embeddings
    from hybridllm.router.evaluate import router_metrics
    from hybridllm.router.features import feature_matrix

    ours = load_routellm_csv(GSM8K)
    data, sources = train.pool([(DATA.name, mmlu), (GSM8K.name, ours)])
    emb_ours = cached_embeddings(ours.prompts)
    all_emb = np.concatenate([emb, emb_ours])
    all_x = np.concatenate([x, feature_matrix(ours.prompts, use_embedding=True, embeddings=emb_ours)])
    runs: dict[str, list[dict[str, float]]] = {"mmlu": [], "gsm8k": []}
    for i, salt in enumerate(_salts(args.salts)):
        oof = train.cross_validate(data, all_x, all_emb, fold_salt=salt, sources=sources).oof_scores
        for key, src in (("mmlu", 0), ("gsm8k", 1)):
            rows = sources.ids == src
            m = router_metrics(oof[rows], data.weak[rows], data.strong[rows])
            runs[key].append({k: round(float(m[k]), 4) for k in ("apgr", "calls_at_95")})
        if not args.json:
            print(f"sources   folds {i}: MMLU {runs['mmlu'][-1]} GSM8K {runs['gsm8k'][-1]}", flush=True)
    return {key: {**_summary(rs), "apgr": [r["apgr"] for r in rs]} for key, rs in runs.items()}


def _curve(data: Any, emb: np.ndarray, x: np.ndarray, *, test_rows: int = 4270) -> dict[str, Any]:
    """The shipped design's MMLU figures against training rows and folds, and one test set's spread."""
    from hybridllm.router import _train_cv, train
    from hybridllm.router.evaluate import router_metrics

    def pick(m: dict[str, float]) -> dict[str, float]:
        return {k: round(float(m[k]), 4) for k in ("apgr", "calls_at_95")}

    gain = (data.strong - data.weak).astype(np.int64)
    folds = train.fold_ids(data.prompts, 5)
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for frac in (0.5, 0.75):
        oof = np.zeros(len(gain))
        for f in range(5):
            test = folds == f
            keep = ~test & (rng.random(len(gain)) < frac)  # a random share of the training folds
            scorer = _train_cv._fit(x, gain, emb, train.Hyper(), None, keep)
            oof[test] = scorer.predict(x[test], emb[test])
        # fold-aligned as cross_validate's (the "5fold" figure beside it): pooled raw, each fold
        # model's own level ranked whole folds and moved these figures by itself
        oof = train.align_folds(oof, folds)
        out[f"5fold_train_{frac}"] = pick(router_metrics(oof, data.weak, data.strong))
    for k in (5, 10, 20):
        cv = train.cross_validate(data, x, emb, num_folds=k)
        out[f"{k}fold"] = pick(cv.metrics)
    # test sets drawn from the last CV's (20-fold) out-of-fold scores: the most training rows a fold
    sets = [rng.choice(len(gain), test_rows, replace=False) for _ in range(200)]
    ms = [router_metrics(cv.oof_scores[s], data.weak[s], data.strong[s]) for s in sets]
    a = np.array([m["apgr"] for m in ms])
    c = np.array([m["calls_at_95"] for m in ms])
    out[f"test_sets_of_{test_rows}"] = {
        "apgr_mean": round(float(a.mean()), 4), "apgr_sd": round(float(a.std()), 4),
        "apgr_p95": round(float(np.quantile(a, 0.95)), 4),
        "calls_at_95_mean": round(float(c.mean()), 4), "calls_at_95_sd": round(float(c.std()), 4),
        "calls_at_95_p05": round(float(np.quantile(c, 0.05)), 4),
    }
    return out


def _salts(n: int) -> list[str]:
    """The fold salts: "" (the shipped assignment) and ``n`` salted ones."""
    return [""] + [f"s{i}" for i in range(n)]


def _summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    calls = [r["calls_at_95"] for r in runs]
    return {"calls_at_95": calls, "calls_at_95_mean": round(float(np.mean(calls)), 4),
            "apgr_mean": round(float(np.mean([r["apgr"] for r in runs])), 4)}


if __name__ == "__main__":
    raise SystemExit(main())
