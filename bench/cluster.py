"""Cluster benchmark: our token/prefix request router versus Ray Serve's default router.

    python -m bench.cluster [--json] [--requests 40] [--rate 0.5] [--kv-cache-mb 36]

One process, one local Ray instance, two phases on the same deployment settings: 2 engine replicas
of SmolLM2-135M (one torch thread each), first behind Ray Serve's default router (power of two
choices on queue length), then behind ours (``cloud_server.cluster.router``); each phase starts
fresh replicas (cold caches) and sends the same seeded workload:

- four tenants, each with its own long shared system prompt (~500 tokens), a short user question;
- a skewed mix of answer lengths: 75% 16-token and 25% long answers (``--long-tokens``, 128 by
  default: the issue's 256 scaled down to keep a run to a few minutes on 2 cores), forced with
  ``ignore_eos``;
- open-loop Poisson arrivals at ``--rate`` requests/s, streamed chat completions.

The KV cache of each replica (``--kv-cache-mb``) holds about two tenants' prompts beside the running
requests, so a router that mixes all tenants on every replica evicts what it needs.

Reported per router: p50/p95 TTFT (sent -> first content chunk), aggregate output tokens/s (all
output tokens / (last finish - first send)), the fleet-wide prefix-cache hit rate (prompt tokens
served from the cache / prompt tokens looked up, summed over replicas from their engine stats), and
errors. Ratios, higher is better: ``p95_ttft_ratio`` = default / ours, ``prefix_hit_rate_ratio`` =
ours / default, ``throughput_ratio`` = ours / default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import sys
import time
from typing import Any

MODEL = "smollm2"
TENANTS = ("acme-legal", "birch-health", "cobalt-retail", "delta-travel")
WORDS = (
    "policy customer account refund contract clause review privacy record data agent answer "
    "escalate verify identity schedule invoice shipment warranty claim support ticket priority "
    "region compliance audit report summary tone brief formal friendly cite source never always"
).split()
QUESTIONS = (
    "How do I reset my password?",
    "What is your refund policy?",
    "Can you summarise my last invoice?",
    "Where is my order right now?",
    "Who do I contact about a warranty claim?",
    "Is my data shared with third parties?",
)


def system_prompt(tenant: str, num_words: int) -> str:
    rng = random.Random(tenant)
    rules = []
    for i in range(num_words // 12):
        rules.append(f"Rule {i + 1}: " + " ".join(rng.choice(WORDS) for _ in range(10)) + ".")
    return f"You are the assistant of {tenant}. Follow these house rules. " + " ".join(rules)


def workload(n: int, rate: float, long_tokens: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        tenant = rng.choice(TENANTS)
        out.append(
            {
                "at": t,
                "tenant": tenant,
                "question": f"{rng.choice(QUESTIONS)} (#{i})",
                "max_tokens": long_tokens if rng.random() < 0.25 else 16,
            }
        )
    return out


async def one(
    client: Any, url: str, req: dict[str, Any], prompts: dict[str, str], t0: float
) -> dict[str, Any]:
    await asyncio.sleep(max(0.0, req["at"] - (time.perf_counter() - t0)))
    body = {
        "model": MODEL,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
        "max_tokens": req["max_tokens"],
        "messages": [
            {"role": "system", "content": prompts[req["tenant"]]},
            {"role": "user", "content": req["question"]},
        ],
    }
    sent = time.perf_counter()
    ttft, chunks, error = None, 0, None
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                error = f"HTTP {resp.status_code}"
            else:
                async for line in resp.aiter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    event = json.loads(line[5:])
                    if event.get("error"):
                        error = "stream error"
                        break
                    for c in event.get("choices") or []:
                        if (c.get("delta") or {}).get("content"):
                            chunks += 1
                            if ttft is None:
                                ttft = time.perf_counter() - sent
    except Exception as exc:  # noqa: BLE001 - counted, not fatal
        error = type(exc).__name__
    return {"ttft": ttft, "max_tokens": req["max_tokens"], "error": error, "end": time.perf_counter() - t0}


def fleet_stats(board_name: str) -> dict[str, float]:
    import ray

    board = ray.get_actor(board_name, namespace="hybridllm")
    snap = ray.get(board.snapshot.remote(5.0))
    keys = ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions")
    out: dict[str, Any] = {k: float(sum(v["stats"].get(k, 0) for v in snap.values())) for k in keys}
    out["per_replica_steps"] = sorted(v["stats"].get("steps", 0) for v in snap.values())
    out["router"] = ray.get(board.notes.remote()).get("router")
    return out


async def drive(url: str, reqs: list[dict[str, Any]], prompts: dict[str, str]) -> list[dict]:
    import httpx

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        t0 = time.perf_counter()
        return await asyncio.gather(*(one(client, url, r, prompts, t0) for r in reqs))


def run_phase(
    router: str,
    args: argparse.Namespace,
    model_path: str,
    port: int,
    reqs: list[dict[str, Any]],
    prompts: dict[str, str],
) -> dict[str, Any]:
    import httpx
    import ray
    from ray import serve

    from cloud_server.cluster.app import APP_NAME, build_app
    from cloud_server.config import ClusterConfig, EngineConfig

    engine = EngineConfig(
        model_path,
        num_threads=1,
        max_model_len=1024,
        max_num_seqs=8,
        kv_cache_memory_bytes=args.kv_cache_mb << 20,
    )
    cluster = ClusterConfig(replicas=2, stats_period_s=0.5)
    board = f"bench-cluster-{router}-{os.getpid()}"
    if not ray.is_initialized():
        from cloud_server.cluster.launch import init_ray

        init_ray(None, attempts=8, include_dashboard=False, num_cpus=4)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
    t_start = time.perf_counter()
    serve.run(
        build_app(engine, cluster, router=router, board_name=board, app_options={"served_model_name": MODEL}),
        name=APP_NAME,
        route_prefix="/",
    )
    url = f"http://127.0.0.1:{port}"
    for i in range(2):  # first-step warm-up on each replica (prompts unrelated to the tenants)
        httpx.post(
            f"{url}/v1/completions",
            timeout=120,
            json={"model": MODEL, "prompt": f"{i} warm up", "max_tokens": 2},
        )
    time.sleep(1.5)
    before = fleet_stats(board)
    load_before = os.getloadavg()[0]
    results = asyncio.run(drive(url, reqs, prompts))
    time.sleep(1.5)  # the replicas' last board posts
    after = fleet_stats(board)
    serve.delete(APP_NAME)
    ok = [r for r in results if r["error"] is None and r["ttft"] is not None]
    ttfts = sorted(r["ttft"] for r in ok)
    queries = after["prefix_cache_queries"] - before["prefix_cache_queries"]
    hits = after["prefix_cache_hits"] - before["prefix_cache_hits"]
    wall = max(r["end"] for r in results) - min(q["at"] for q in reqs)
    return {
        "router": router,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "ttft_p50_s": round(statistics.median(ttfts), 3) if ttfts else None,
        "ttft_p95_s": round(_pct(ttfts, 95), 3) if ttfts else None,
        "throughput_tok_s": round(sum(r["max_tokens"] for r in ok) / wall, 2),
        "prefix_hit_rate": round(hits / queries, 4) if queries else 0.0,
        "prefix_cache_hits": int(hits),
        "prefix_cache_queries": int(queries),
        "preemptions": int(after["num_preemptions"] - before["num_preemptions"]),
        "engine_steps_per_replica": after["per_replica_steps"],
        "router_decisions": after["router"],
        "wall_s": round(wall, 1),
        "phase_s": round(time.perf_counter() - t_start, 1),
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def _pct(values: list[float], q: float) -> float:
    k = max(0, min(len(values) - 1, int(round(q / 100 * len(values) + 0.5)) - 1))
    return values[k]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--rate", type=float, default=0.5, help="arrivals per second (Poisson)")
    p.add_argument("--long-tokens", type=int, default=128, help="the long answers' length")
    p.add_argument("--prompt-words", type=int, default=380, help="words in each system prompt")
    p.add_argument("--kv-cache-mb", type=int, default=36, help="KV cache per replica")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        import ray
        from ray import serve
    except ImportError:
        print("bench.cluster needs Ray Serve: pip install 'hybridllm[cluster]'", file=sys.stderr)
        return 1
    from hybridllm.models import pull

    model_path = str(pull("smollm2-135m-instruct"))
    prompts = {t: system_prompt(t, args.prompt_words) for t in TENANTS}
    reqs = workload(args.requests, args.rate, args.long_tokens, args.seed)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    phases = {}
    try:
        for router in ("default", "tokens"):
            phases[router] = run_phase(router, args, model_path, port, reqs, prompts)
            if not args.json:
                print(json.dumps(phases[router]), file=sys.stderr)
    finally:
        serve.shutdown()
        ray.shutdown()
    d, o = phases["default"], phases["tokens"]
    out = {
        "bench": "cluster",
        "replicas": 2,
        "model": "SmolLM2-135M-Instruct (int8 weights, 1 torch thread per replica)",
        "workload": {
            "requests": args.requests,
            "rate_per_s": args.rate,
            "tenants": len(TENANTS),
            "system_prompt_words": args.prompt_words,
            "answers": f"75% 16 / 25% {args.long_tokens} tokens (ignore_eos)",
            "kv_cache_mb_per_replica": args.kv_cache_mb,
            "seed": args.seed,
        },
        "default": d,
        "ours": o,
        "p95_ttft_ratio": round(d["ttft_p95_s"] / o["ttft_p95_s"], 3)
        if d["ttft_p95_s"] and o["ttft_p95_s"]
        else None,
        "prefix_hit_rate_ratio": round(o["prefix_hit_rate"] / d["prefix_hit_rate"], 3)
        if d["prefix_hit_rate"]
        else None,
        "throughput_ratio": round(o["throughput_tok_s"] / d["throughput_tok_s"], 3)
        if d["throughput_tok_s"]
        else None,
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
