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
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# Fleet: a public name of bench.cluster, imported from here by tests/cloud_server/cluster/test_bench.py
from bench._cluster_fleet import Fleet  # noqa: F401
from bench._cluster_phase import run_phase
from bench._cluster_requests import QUESTIONS, TENANTS, say, system_prompt, workload
from hybridllm._cli_options import non_negative_int, positive_float, positive_int, unit_interval

ROUTERS = ("default", "tokens")


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
            _kill_phase(proc, session_file)
            return {"router": router, "valid": False, "invalid_reason": f"phase ran past {timeout_s:.0f} s"}
        except BaseException:
            # Ctrl-C: the child runs in its own session (the terminal's SIGINT never reaches it),
            # so without this its Ray and Serve processes and their port outlived the benchmark
            _kill_phase(proc, session_file)
            raise
        if proc.returncode != 0:
            _kill_session(session_file)
            return {"router": router, "valid": False, "invalid_reason": f"phase exited {proc.returncode}"}
        return json.loads(out.strip().splitlines()[-1])


def _kill_phase(proc: subprocess.Popen, session_file: str) -> None:
    """The phase's process group, then what its Ray session left running."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group has already gone
        pass
    proc.communicate()
    _kill_session(session_file)


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
