"""One bench.cluster phase: a fresh Ray and Serve, the warm-up, the measured workload, its figures."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench._cluster_fleet import Fleet
from bench._cluster_requests import MODEL, TENANTS, chat_body, one, say, system_prompt, workload
from bench.serving import nearest_rank


# -- one phase (runs in its own process) ---------------------------------------------------------
async def _warm_up(url: str, client: Any, fleet: Fleet, prompts: dict[str, str], rounds: int) -> None:
    # engine warm-up: until both replicas have run steps (first steps allocate and are slow)
    for round_ in range(6):
        bodies = [chat_body(None, f"Say hello, number {round_}-{i}.", 4) for i in range(4)]
        await asyncio.gather(*(one(client, url, b, 0.0, time.perf_counter()) for b in bodies))
        await asyncio.sleep(1.5)
        snap = await fleet.snapshot()
        if len(snap) >= 2 and all(v["stats"].get("steps", 0) > 0 for v in snap.values()):
            break
    # tenant warm-up: every tenant once per round, in order, one at a time (the same in both phases)
    for round_ in range(rounds):
        for tenant in TENANTS:
            body = chat_body(prompts[tenant], f"Hello ({round_}).", 4)
            result = await one(client, url, body, 0.0, time.perf_counter())
            if result["error"]:
                raise RuntimeError(f"warm-up request failed: {result['error']}")


async def _measure(
    url: str, fleet: Fleet, reqs: list[dict[str, Any]], prompts: dict[str, str], warm_rounds: int
) -> tuple[list[dict[str, Any]], dict, dict, dict]:
    import httpx

    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        say(f"warming up (engines, then {warm_rounds} round(s) of one request per tenant)")
        await _warm_up(url, client, fleet, prompts, warm_rounds)
        await asyncio.sleep(2.5)  # the replicas' next posts carry the warm-up's counters
        before = await fleet.snapshot()
        if len(before) != 2:
            raise RuntimeError(f"{len(before)} replicas report after the warm-up, expected 2")
        fleet.pin(before)
        say(f"measuring {len(reqs)} requests over {reqs[-1]['at']:.0f} s (open loop)")
        t0 = time.perf_counter()
        tasks = [
            asyncio.create_task(
                one(client, url, chat_body(prompts[r["tenant"]], r["question"], r["max_tokens"]), r["at"], t0)
            )
            for r in reqs
        ]
        last_note, done = 0.0, 0
        while done < len(tasks):
            await asyncio.sleep(1.0)
            fleet.check(await fleet.snapshot())
            done = sum(t.done() for t in tasks)
            if time.perf_counter() - last_note > 20:
                last_note = time.perf_counter()
                say(f"{done}/{len(tasks)} done, t={last_note - t0:.0f} s, load {os.getloadavg()[0]:.2f}")
        results = [t.result() for t in tasks]
        await asyncio.sleep(2.5)
        after = await fleet.snapshot()
        fleet.check(after)
        return results, before, after, await fleet.notes()


def run_phase(router: str, args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    from cloud_server.cluster import launch
    from cloud_server.cluster.app import APP_NAME, ENGINE
    from cloud_server.config import ClusterConfig, EngineConfig
    from hybridllm.models import pull

    prompts = {t: system_prompt(t, args.prompt_words) for t in TENANTS}
    reqs = workload(args.requests, args.rate, args.long_tokens, args.long_share, args.seed)
    engine = EngineConfig(
        str(pull("smollm2-135m-instruct")),
        num_threads=1,
        max_model_len=1024,
        max_num_seqs=8,
        kv_cache_memory_bytes=args.kv_cache_mb << 20,
    )
    cluster = ClusterConfig(replicas=2, stats_period_s=0.5)
    board = f"bench-cluster-{router}-{os.getpid()}"
    port = launch.free_port()  # not an ephemeral one, which Ray's own processes may take first
    load_start = os.getloadavg()[0]
    t_start = time.perf_counter()
    say(f"phase {router}: starting a fresh Ray and Serve, 2 replicas")
    try:
        url = launch.start(
            engine,
            cluster,
            host="127.0.0.1",
            port=port,
            router=router,
            app_options={"served_model_name": MODEL},
            ray_init={"attempts": 8, "include_dashboard": False, "num_cpus": 4},
            board_name=board,
        )
        if args.session_file:
            node = ray._private.worker.global_worker.node
            Path(args.session_file).write_text(node.get_session_dir_path())
        say(f"phase {router}: replicas up after {time.perf_counter() - t_start:.0f} s")
        fleet = Fleet(ray.get_actor(board, namespace="hybridllm"))
        results, before, after, notes = asyncio.run(_measure(url, fleet, reqs, prompts, args.warm_rounds))
        try:
            states = serve.status().applications[APP_NAME].deployments[ENGINE].replica_states
            replica_states = {str(k): v for k, v in states.items()}
        except Exception as exc:  # noqa: BLE001 - a figure, not a check
            replica_states = {"unknown": str(exc)}
    finally:
        launch.stop(cluster)
    say(f"phase {router}: done in {time.perf_counter() - t_start:.0f} s, Ray stopped")

    ok = [r for r in results if r["error"] is None]
    ttfts = sorted(r["ttft"] for r in ok)
    per_replica = {}
    for rid in sorted(set(before) & set(after)):
        b, a = before[rid]["stats"], after[rid]["stats"]
        q = a["prefix_cache_queries"] - b["prefix_cache_queries"]
        h = a["prefix_cache_hits"] - b["prefix_cache_hits"]
        per_replica[rid] = {
            "prefix_cache_queries": q,
            "prefix_cache_hits": h,
            "engine_counter_hit_rate": round(h / q, 4) if q else None,
            "preemptions": a["num_preemptions"] - b["num_preemptions"],
            "engine_steps": a["steps"] - b["steps"],
            "kv_blocks": a["num_total_blocks"],
        }
    # engine counters count each request's prompt once, at its first admission (as cached_tokens
    # does); runs from before 2026-11-27 counted every admission attempt: reported, not the headline
    queries = sum(v["prefix_cache_queries"] for v in per_replica.values())
    hits = sum(v["prefix_cache_hits"] for v in per_replica.values())
    # the headline: each request's prompt tokens the replica served from its cache when it
    # admitted the request (usage.prompt_tokens_details.cached_tokens), over all prompt tokens
    prompt_tokens = sum(r["prompt_tokens"] or 0 for r in ok)
    cached_tokens = sum(r["cached_tokens"] or 0 for r in ok)
    missing_usage = sum(r["prompt_tokens"] is None or r["cached_tokens"] is None for r in ok)
    wall = max(r["end"] for r in results) - min(r["sent"] for r in results)
    errors: dict[str, int] = {}
    for r in results:
        if r["error"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    invalid = list(fleet.deaths)
    if errors:
        invalid.append(f"{sum(errors.values())} of {len(results)} requests failed: {errors}")
    if missing_usage:
        invalid.append(f"{missing_usage} responses carried no usage (no hit rate for them)")
    return {
        "router": router,
        "valid": not invalid,
        "invalid_reason": "; ".join(invalid) or None,
        "requests": len(results),
        "errors": sum(errors.values()),
        "ttft_p50_s": round(statistics.median(ttfts), 3) if ttfts else None,
        "ttft_p95_s": round(nearest_rank(ttfts, 95), 3) if ttfts else None,
        "ttft_max_s": round(ttfts[-1], 3) if ttfts else None,
        "throughput_tok_s": round(sum(r["output_tokens"] or r["max_tokens"] for r in ok) / wall, 2),
        "prefix_hit_rate": round(cached_tokens / prompt_tokens, 4) if prompt_tokens else None,
        "prompt_tokens": prompt_tokens,
        "cached_prompt_tokens": cached_tokens,
        "requests_without_usage": missing_usage,
        "engine_counter_hit_rate": round(hits / queries, 4) if queries else None,
        "engine_counter_lookups": int(queries),
        "engine_counter_hits": int(hits),
        "preemptions": sum(v["preemptions"] for v in per_replica.values()),
        "per_replica": list(per_replica.values()),
        "replica_states_at_end": replica_states,
        "router_decisions": notes.get("router"),
        "wall_s": round(wall, 1),
        "phase_s": round(time.perf_counter() - t_start, 1),
        "loadavg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        # one record per measured request, in arrival order (written by --trace, not printed)
        "trace": [
            {"tenant": q["tenant"], **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}}
            for q, r in zip(reqs, results, strict=True)
        ],
    }
