"""Latency of one routing decision on the device (``RoutingPolicy.decide`` with the shipped router).

    python -m bench.router [--json] [--n 300]

- ``with_embedding_p50_ms`` / ``_p99_ms``: the whole decision: PII scan, text features, the int8
  MiniLM embedding of the last user turn, the linear, nearest-neighbor and topic parts.
- ``without_embedding_p50_ms`` / ``_p99_ms``: the same decision given the prompt's embedding
  (the pipeline passes the one the semantic cache already computed), so the embedder is excluded.
- ``short_with_embedding_p50_ms``: the whole decision for short chat prompts (under 100 chars);
  the embedder's cost grows with the prompt's length (MMLU prompts with options are ~120 tokens).
- ``text_only_p50_ms``: a router trained on text features only (no embedding, no neighbors).
- ``embedding_share``: (with - without) / with, at the median.
Prompts: MMLU and GSM8K questions from ../shared/data when present, else built-in ones.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from hybridllm._cli_options import positive_int

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "routellm"
FALLBACK = [
    "What is the capital of France?",
    "Prove that the square root of 2 is irrational.",
    "Write a Python function that merges two sorted lists.",
    "A train leaves at 3 pm at 60 km/h; another at 4 pm at 80 km/h. When does it catch up?",
    "Summarize the causes of the First World War in three sentences.",
]


def load_prompts(n: int) -> list[str]:
    prompts: list[str] = []
    mmlu, gsm = DATA / "mmlu_responses.csv", DATA / "gsm8k_train_questions.jsonl"
    if mmlu.is_file() and gsm.is_file():
        csv.field_size_limit(sys.maxsize)
        with mmlu.open(newline="", encoding="utf-8") as fh:
            rows = [r["prompt"] for r in csv.DictReader(fh)]
        gsm_q = [json.loads(x)["question"] for x in gsm.read_text().splitlines()[: n // 2]]
        rng = np.random.default_rng(0)
        picked = [rows[i] for i in rng.choice(len(rows), size=n - len(gsm_q), replace=False)]
        prompts = picked + gsm_q
    while len(prompts) < n:
        prompts += FALLBACK
    return prompts[:n]


def timed(fn, items, warmup: int = 10) -> np.ndarray:
    for item in items[:warmup]:
        fn(item)
    out = np.empty(len(items))
    for i, item in enumerate(items):
        t0 = time.perf_counter()
        fn(item)
        out[i] = (time.perf_counter() - t0) * 1000.0
    return out


def text_only_router(prompts: list[str]):
    """A text-feature router fitted on the benchmark prompts with synthetic labels (speed only)."""
    from hybridllm.router.features import text_feature_matrix
    from hybridllm.router.fit import fit_gain_scorer
    from hybridllm.router.router import Router

    x = text_feature_matrix(prompts)
    gain = (x[:, 0] > np.median(x[:, 0])).astype(np.int64)
    scorer = fit_gain_scorer(x, gain)
    return Router(scorer=scorer, threshold=0.5, use_embedding=False)


def run(n: int) -> dict[str, float | int | str]:
    from hybridllm.router import RoutingPolicy, load_router
    from hybridllm.router.features import embed_texts

    prompts = load_prompts(n)
    messages = [[{"role": "user", "content": p}] for p in prompts]
    policy = RoutingPolicy(load_router(), privacy="redact")
    embeddings = embed_texts(prompts)
    with_emb = timed(policy.decide, messages)
    pairs = list(zip(messages, embeddings, strict=True))
    without = timed(lambda mp: policy.decide(mp[0], embedding=mp[1]), pairs)
    short = [m for m in messages if len(m[0]["content"]) < 100] or [
        [{"role": "user", "content": p}] for p in FALLBACK]
    short_with = timed(policy.decide, (short * 5)[:100])
    text_policy = RoutingPolicy(text_only_router(prompts), privacy="redact")
    text_only = timed(text_policy.decide, messages)

    def pct(a: np.ndarray, q: float) -> float:
        return round(float(np.percentile(a, q)), 3)

    p50_with, p50_without = pct(with_emb, 50), pct(without, 50)
    return {
        "n": n,
        "cpu_count": os.cpu_count() or 0,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "with_embedding_p50_ms": p50_with,
        "with_embedding_p99_ms": pct(with_emb, 99),
        "without_embedding_p50_ms": p50_without,
        "without_embedding_p99_ms": pct(without, 99),
        "short_with_embedding_p50_ms": pct(short_with, 50),
        "text_only_p50_ms": pct(text_only, 50),
        "text_only_p99_ms": pct(text_only, 99),
        "embedding_share": round((p50_with - p50_without) / p50_with, 3) if p50_with else 0.0,
        "goal": "p50 < 10 ms with embedding, < 1 ms without",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    # no prompt would leave no latency to take a percentile of (an IndexError)
    parser.add_argument("--n", type=positive_int, default=300, help="prompts routed (default 300)")
    args = parser.parse_args(argv)
    result = run(args.n)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:28} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
