"""A mixed workload through HybridLLM versus cloud-only and edge-only, in one run.

    python -m bench.hybrid [--json] [--n 200] [--max-tokens 32] [--cloud-fraction 0.3]

Workload (real prompts from ../shared/data, fixed seed): general questions from Quora Question
Pairs, MMLU questions and GSM8K word problems, with about 30% of requests being paraphrased
repeats (the other side of a QQP duplicate pair) of a question asked earlier. A local
`hybridllm-cloud serve` on the embedded model plays the cloud. Each mode answers the same
sequence; we report mean and p95 latency, cloud tokens used and the cache hit rate.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.serving import nearest_rank
from hybridllm._cli_options import positive_int, unit_interval

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def workload(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    pairs = [json.loads(line) for line in (DATA / "paraphrase" / "qqp_pairs.jsonl").open()]
    dupes = [p for p in pairs if p["label"] == 1 and len(p["text_a"]) < 160]
    with (DATA / "routellm" / "mmlu_responses.csv").open() as f:
        mmlu = [row["prompt"] for row in csv.DictReader(f) if len(row["prompt"]) < 600]
    gsm = [json.loads(line)["question"]
           for line in (DATA / "routellm" / "gsm8k_train_questions.jsonl").open()]
    n_repeat = round(n * 0.3)
    n_unique = n - n_repeat
    n_qqp = max(n_repeat, n_unique // 2)
    chosen = rng.sample(dupes, n_qqp)
    unique = [p["text_a"] for p in chosen]
    rest = n_unique - n_qqp
    unique += rng.sample(mmlu, rest // 2) + rng.sample(gsm, rest - rest // 2)
    rng.shuffle(unique)
    sequence = list(unique)
    first_seen = {q: i for i, q in enumerate(sequence)}
    for p in rng.sample(chosen, n_repeat):  # a paraphrase, placed after its original
        at = rng.randint(first_seen[p["text_a"]] + 1, len(sequence))
        sequence.insert(at, p["text_b"])
    return sequence


def p95(xs: list[float]) -> float:
    # nearest rank: the ceil(0.95 n)-th smallest (round() took the 28th of 30, not the 29th)
    return nearest_rank(sorted(xs), 95)


def _ratio(a: float, b: float) -> float | None:
    """``a / b``, or None (JSON null) when cloud-only measured nothing to compare with: dividing
    by max(b, 1) gave 0 cloud tokens (a cloud that reports no usage) as "hybrid uses 0%" of them."""
    return round(a / b, 3) if b else None


def run_mode(llm, prompts: list[str], options: dict) -> dict:
    lat, cloud_tokens, hits = [], 0, 0
    routes: dict[str, int] = {}
    for prompt in prompts:
        c = llm.chat(prompt, **options)
        lat.append(c.latency_ms)
        routes[c.route] = routes.get(c.route, 0) + 1
        hits += c.route == "cache"
        if c.route in ("cloud", "edge->cloud"):
            cloud_tokens += c.usage.total_tokens
    return {"latency_ms_mean": round(statistics.fmean(lat), 1), "latency_ms_p95": round(p95(lat), 1),
            "cloud_tokens": cloud_tokens, "cache_hit_rate": round(hits / len(prompts), 3),
            "routes": routes}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object only")
    ap.add_argument("--n", type=positive_int, default=200,
                    help="prompts, 30%% of them paraphrased repeats (default 200)")
    ap.add_argument("--max-tokens", type=positive_int, default=32, help="tokens per answer (default 32)")
    ap.add_argument("--cloud-fraction", type=unit_interval, default=0.3,
                    help="router threshold calibrated to send this share of the unique prompts")
    args = ap.parse_args(argv)
    if not DATA.is_dir():
        raise SystemExit(f"bench.hybrid needs ../shared/data (looked in {DATA})")

    from hybridllm import HybridLLM
    from hybridllm.demo import _free_port, _start_cloud
    from hybridllm.router import load_router
    from hybridllm.router.calibrate import calibrate_threshold

    try:
        prompts = workload(args.n)
    except ValueError as exc:  # more prompts than the data holds ("Sample larger than population")
        ap.error(f"--n {args.n}: {exc}")
    work = Path(tempfile.mkdtemp(prefix="bench-hybrid-"))
    port = _free_port()
    server = _start_cloud(port, work / "cloud.log")
    try:
        router = load_router()
        threshold = calibrate_threshold([router.score(p) for p in set(prompts)], args.cloud_fraction)
        common = {"cloud_url": f"http://127.0.0.1:{port}", "temperature": 0.0,
                  "max_tokens": args.max_tokens, "n_ctx": 2048}
        t0 = time.monotonic()
        with HybridLLM(cache_path=str(work / "cache.db"), threshold=threshold, **common) as llm:
            hybrid = run_mode(llm, prompts, {})
            cloud_only = run_mode(llm, prompts, {"route": "cloud"})
            edge_only = run_mode(llm, prompts, {"route": "edge"})
        result = {
            "bench": "hybrid", "requests": len(prompts), "max_tokens": args.max_tokens,
            "paraphrased_repeats": round(args.n * 0.3), "threshold": round(threshold, 4),
            "hybrid": hybrid, "cloud_only": cloud_only, "edge_only": edge_only,
            "mean_latency_ratio_hybrid_over_cloud_only": _ratio(
                hybrid["latency_ms_mean"], cloud_only["latency_ms_mean"]),
            "cloud_tokens_ratio_hybrid_over_cloud_only": _ratio(
                hybrid["cloud_tokens"], cloud_only["cloud_tokens"]),
            "seconds": round(time.monotonic() - t0, 1),
        }
    except BaseException:
        print(f"bench.hybrid: the cloud server's log and the cache are kept in {work}", file=sys.stderr)
        raise
    finally:
        server.kill()
        server.wait(timeout=30)
    shutil.rmtree(work, ignore_errors=True)  # the cache database and the server log of a good run
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
