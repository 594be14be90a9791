"""Cluster benchmark: our token/prefix request router versus Ray Serve's default router.

    python -m bench.cluster [--json] [--requests 56] [--rate 0.3] [--kv-cache-mb 32] [--trace FILE]

Two phases, one per router, each in its own process with its own fresh local Ray instance and Serve
(nothing carries over from the other phase): 2 engine replicas of SmolLM2-135M (one torch thread
each) behind Ray Serve's default router (power of two choices on queue length), and behind ours
(``cloud_server.cluster.router``). Each phase does the same things in the same order:

1. start Ray and Serve, deploy, wait until ``/health`` says both replicas are up;
2. warm-up: short unrelated requests until both replicas have run engine steps, then
   ``--warm-rounds`` rounds (1) of one short request per tenant, in tenant order, one at a time
   (so each router has placed every tenant, as in a fleet that has been running);
3. the measured workload, the same seeded list in both phases, open loop: requests are sent at
   their Poisson arrival times whatever the fleet's state, so queueing shows in TTFT;
4. the prefix-cache hit rate comes from the replicas themselves: each response's usage says how
   many of its prompt tokens the replica served from its cache when it admitted the request
   (``prompt_tokens_details.cached_tokens``); the engines' own counters (lookups, hits,
   preemptions, steps), posted to the fleet board once a second, are read before and after step
   3 and reported beside it (they count a lookup per admission attempt: a request waiting for
   free blocks is looked up again every step, which inflates both lookups and hits).

The workload: four tenants, each with its own long shared system prompt (~500 tokens) and a short
user question; answers forced to their length with ``ignore_eos``: 75% 16 tokens, 25% 256 tokens.

Memory pressure: ``--kv-cache-mb`` sizes each replica's KV pool. The default (32 MiB = 91 blocks
of 16 tokens, 1,456 token slots) holds the prefixes of about two tenants (2 x ~500 tokens) plus
working space for the running answers, as a fleet serving more tenants than one replica can cache
would. Run it with a large pool (``--kv-cache-mb 128``) for the case without that pressure.

A replica that dies (its process exits, a replacement appears, or it stops reporting) and any
failed request make the run invalid: the phase is reported with the reason and no ratio is given.

Reported per router: p50/p95 TTFT (sent -> first content chunk), aggregate output tokens/s (all
output tokens / (last finish - first send)), the fleet-wide prefix-cache hit rate (prompt tokens
the replicas served from their caches / all prompt tokens, over the measured requests). Ratios,
higher is better: ``p95_ttft_ratio`` = default / ours, ``prefix_hit_rate_ratio`` = ours / default,
``throughput_ratio`` = ours / default. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.serving import nearest_rank
from hybridllm._cli_options import non_negative_int, positive_float, positive_int, unit_interval

MODEL = "smollm2"
ROUTERS = ("default", "tokens")
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


def say(msg: str) -> None:
    print(f"[bench.cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def system_prompt(tenant: str, num_words: int) -> str:
    rng = random.Random(tenant)
    rules = []
    for i in range(num_words // 12):
        rules.append(f"Rule {i + 1}: " + " ".join(rng.choice(WORDS) for _ in range(10)) + ".")
    return f"You are the assistant of {tenant}. Follow these house rules. " + " ".join(rules)


def workload(n: int, rate: float, long_tokens: int, long_share: float, seed: int) -> list[dict[str, Any]]:
    """Poisson arrivals (exponential gaps, mean 1/rate), tenant and answer length drawn per request."""
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
                "max_tokens": long_tokens if rng.random() < long_share else 16,
            }
        )
    return out


def chat_body(system: str | None, question: str, max_tokens: int) -> dict[str, Any]:
    messages = [{"role": "user", "content": question}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return {
        "model": MODEL,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
        "max_tokens": max_tokens,
        "messages": messages,
        "stream_options": {"include_usage": True},
    }


async def one(client: Any, url: str, body: dict[str, Any], at: float, t0: float) -> dict[str, Any]:
    await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
    sent = time.perf_counter()
    ttft, chunks, error, usage = None, 0, None, None
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
                        error = f"stream error: {str(event['error'])[:120]}"
                        break
                    usage = event.get("usage") or usage
                    for c in event.get("choices") or []:
                        if (c.get("delta") or {}).get("content"):
                            chunks += 1
                            if ttft is None:
                                ttft = time.perf_counter() - sent
    except Exception as exc:  # noqa: BLE001 - counted, not fatal
        error = type(exc).__name__
    if error is None and ttft is None:
        error = "no content"
    usage = usage or {}
    return {
        "ttft": ttft,
        "max_tokens": body["max_tokens"],
        "output_tokens": usage.get("completion_tokens"),
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "error": error,
        "sent": sent - t0,
        "end": time.perf_counter() - t0,
    }


# -- one phase (runs in its own process) ---------------------------------------------------------
class Fleet:
    """The replicas as the fleet board sees them, and whether any of them died."""

    def __init__(self, board: Any) -> None:
        self.board = board
        self.pids: dict[str, int] = {}  # replica id -> pid, fixed after the warm-up
        self.deaths: list[str] = []

    async def snapshot(self, max_age_s: float = 5.0) -> dict[str, dict[str, Any]]:
        return await self.board.snapshot.remote(max_age_s)

    async def notes(self) -> dict[str, Any]:
        return await self.board.notes.remote()

    def pin(self, snap: dict[str, dict[str, Any]]) -> None:
        self.pids = {rid: int(v["pid"]) for rid, v in snap.items()}

    def check(self, snap: dict[str, dict[str, Any]]) -> None:
        """A replica died when its process is gone, a new replica id shows up (Serve replaced
        one), or a pinned replica stopped posting (it posts every second; 5 s is the limit)."""
        for rid, pid in self.pids.items():
            if not _alive(pid):
                self._death(f"replica {rid} (pid {pid}) exited")
            elif rid not in snap:
                self._death(f"replica {rid} (pid {pid}) stopped reporting for 5 s")
        for rid in snap:
            if rid not in self.pids:
                self._death(f"a new replica {rid} appeared (Serve replaced one)")

    def _death(self, what: str) -> None:
        if what not in self.deaths:
            self.deaths.append(what)
            say(f"REPLICA DEATH: {what}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


# -- the driver: one child process per phase -----------------------------------------------------
def _phase_in_child(router: str, argv: list[str], timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        session_file = os.path.join(tmp, "session")
        cmd = [sys.executable, "-m", "bench.cluster", *argv, "--phase", router]
        cmd += ["--session-file", session_file]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            _kill_session(session_file)
            return {"router": router, "valid": False, "invalid_reason": f"phase ran past {timeout_s:.0f} s"}
        if proc.returncode != 0:
            _kill_session(session_file)
            return {"router": router, "valid": False, "invalid_reason": f"phase exited {proc.returncode}"}
        return json.loads(out.strip().splitlines()[-1])


def _kill_session(session_file: str) -> None:
    """Processes of a phase's Ray session that outlived it (found by its session folder)."""
    try:
        session = Path(session_file).read_text().strip()
    except OSError:
        return
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if session.encode() in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
                say(f"killed leftover Ray process {proc.name}")
        except (OSError, ValueError):
            continue


def _prefix_tokens(prompts: dict[str, str]) -> int:
    """Tokens a tenant's requests share (its system prompt in the chat template)."""
    from cloud_server.cluster.remote_engine import _load_tokenizer
    from hybridllm.models import pull

    tok = _load_tokenizer(Path(pull("smollm2-135m-instruct")))

    def ids(question: str) -> list[int]:
        messages = [{"role": "system", "content": prompts[TENANTS[0]]}, {"role": "user", "content": question}]
        return tok.encode(tok.apply_chat_template(messages))

    a, b = ids(QUESTIONS[0]), ids(QUESTIONS[1])
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--requests", type=positive_int, default=56, help="requests per phase (default 56)")
    p.add_argument("--rate", type=positive_float, default=0.3,
                   help="arrivals a second, Poisson (default 0.3)")
    p.add_argument("--long-tokens", type=positive_int, default=256, help="long answers' tokens (default 256)")
    p.add_argument("--long-share", type=unit_interval, default=0.25,
                   help="share of long answers (default 0.25)")
    p.add_argument("--prompt-words", type=non_negative_int, default=380,
                   help="words in each system prompt (default 380)")
    p.add_argument("--kv-cache-mb", type=positive_int, default=32,
                   help="KV cache per replica in MiB (default 32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload (default 0)")
    p.add_argument("--warm-rounds", type=non_negative_int, default=1,
                   help="warm-up rounds, one per tenant (default 1)")
    p.add_argument("--order", default="default,tokens", help="phase order (default default,tokens)")
    p.add_argument("--phase-timeout", type=positive_float, default=420.0,
                   help="seconds per phase (default 420)")
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="also write every measured request (router, tenant, answer length, sent, TTFT, cached "
        "prompt tokens, error) to this JSON Lines file",
    )
    p.add_argument("--phase", choices=ROUTERS, help=argparse.SUPPRESS)  # internal: one phase
    p.add_argument("--session-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        print("bench.cluster needs Ray Serve: pip install 'hybridllm[cluster]'", file=sys.stderr)
        return 1
    if args.phase:
        print(json.dumps(run_phase(args.phase, args)))
        return 0

    order = [r.strip() for r in args.order.split(",")]
    if sorted(order) != sorted(ROUTERS):
        p.error(f"--order names both routers once: {','.join(ROUTERS)}")
    prompts = {t: system_prompt(t, args.prompt_words) for t in TENANTS}
    reqs = workload(args.requests, args.rate, args.long_tokens, args.long_share, args.seed)
    mean_tokens = statistics.mean(r["max_tokens"] for r in reqs)
    child_argv = [
        f"--requests={args.requests}", f"--rate={args.rate}", f"--long-tokens={args.long_tokens}",
        f"--long-share={args.long_share}", f"--prompt-words={args.prompt_words}",
        f"--kv-cache-mb={args.kv_cache_mb}", f"--seed={args.seed}", f"--warm-rounds={args.warm_rounds}",
    ]  # fmt: skip
    prefix = _prefix_tokens(prompts)
    phases = {}
    if args.trace:
        Path(args.trace).write_text("", encoding="utf-8")
    for router in order:
        phases[router] = _phase_in_child(router, child_argv, args.phase_timeout)
        trace = phases[router].pop("trace", [])
        if args.trace:
            with open(args.trace, "a", encoding="utf-8") as fh:
                fh.writelines(json.dumps({"router": router, **r}) + "\n" for r in trace)
        say(f"phase {router}: {json.dumps({k: v for k, v in phases[router].items() if k != 'per_replica'})}")
    d, o = phases["default"], phases["tokens"]
    valid = bool(d.get("valid") and o.get("valid"))

    def ratio(num: float | None, den: float | None) -> float | None:
        return round(num / den, 3) if valid and num and den else None

    blocks = (d.get("per_replica") or o.get("per_replica") or [{}])[0].get("kv_blocks")
    out = {
        "bench": "cluster",
        "valid": valid,
        "replicas": 2,
        "model": "SmolLM2-135M-Instruct (int8 weights, 1 torch thread per replica, max_num_seqs 8)",
        "workload": {
            "requests": args.requests,
            "arrivals": f"open loop, Poisson, {args.rate}/s (seed {args.seed})",
            "offered_output_tok_s": round(args.rate * mean_tokens, 1),
            "tenants": len(TENANTS),
            "tenant_prefix_tokens": prefix,
            "answers": f"{1 - args.long_share:.0%} 16 / {args.long_share:.0%} {args.long_tokens} tokens"
            " (ignore_eos)",
            "long_answers": sum(r["max_tokens"] == args.long_tokens for r in reqs),
            "warm_up": f"engines, then {args.warm_rounds} round(s) of one request per tenant",
        },
        "kv_pool_per_replica": {
            "mib": args.kv_cache_mb,
            "blocks": blocks,
            "token_slots": blocks * 16 if blocks else None,
            "tenant_prefixes_it_holds": round(blocks * 16 / prefix, 2) if blocks and prefix else None,
        },
        "default": d,
        "ours": o,
        "p95_ttft_ratio": ratio(d.get("ttft_p95_s"), o.get("ttft_p95_s")),
        "prefix_hit_rate_ratio": ratio(o.get("prefix_hit_rate"), d.get("prefix_hit_rate")),
        "throughput_ratio": ratio(o.get("throughput_tok_s"), d.get("throughput_tok_s")),
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(out, indent=None if args.json else 2))
    return 0 if valid else 2


if __name__ == "__main__":
    sys.exit(main())
