"""Speculative decoding benchmark: one server with and without it, and llama-cpp-python's
prompt-lookup drafting, on the same GGUF, measured side by side in one run.

    python -m bench.speculative [--json] [--model smollm2-135m-instruct]
        [--draft-model qwen2.5-coder-0.5b-instruct [--draft-vocab-size N]] [--num-prompts 8]
        [--max-tokens 96] [--prompts short|long|FILE]

Our server starts once with ``--speculative-method ngram`` (or ``draft`` with ``--draft-model``);
each request picks its method with the request field ``speculative_method`` (``none`` is plain
decoding), so "off" and "on" are the same process, weights and threads. llama-cpp-python's
server runs twice on the same GGUF: plain, and with ``--draft_model prompt-lookup-decoding``
(its ``LlamaPromptLookupDecoding``, ``--draft_model_num_pred_tokens`` = our K).

1. Concurrency 1, greedy, input-grounded prompts (fix, rewrite or extract from a given passage or
   code): ``--prompts short`` (bench/data/speculative_prompts.jsonl, 16 prompts of
   50-107 tokens) or ``long`` (speculative_prompts_long.jsonl, 12 prompts of 153-294 tokens:
   code and passages of a realistic length, a whole module to fix, an email to extract from).
   Prompt by prompt, every mode runs in turn, so a load change on the machine hits all modes
   alike. Decode tokens/s per mode = sum(output tokens - 1) / sum(time from first to last
   streamed token); beside it the mean time to the first token and the mean whole request.
   Before the first prompt every mode answers once unmeasured (32 tokens), so no mode is
   measured on its first steps. Each prompt is first sent once for one token to every server,
   so all modes meet a warm prefix cache and their TTFTs compare: a draft model prefills its
   own KV in the target's prefill step, which the draft mode's TTFT shows.
2. With ``--draft-model``: the same at concurrency 1 on open GSM8K questions, draft vs off.
3. Concurrency 16: 16 grounded requests at once, off then on (our server): output tokens / wall.
Acceptance (accepted / proposed draft tokens, mean acceptance length) comes from the server's
/metrics counters, read around each speculative request. Output tokens are re-counted from the
text with the GGUF's vocabulary for every server alike. A ratio over a mode that decoded nothing
is null; a server failing mid-run ends with exit status 1 and the report so far with an ``error``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.serving import (
    GSM8K,
    free_port,
    model_gguf,
    peak_rss,
    positive_int,
    ratio,
    stop_server,
    token_counter,
    wait_ready,
)
from cloud_server.engine.spec_decode.decoder import DEFAULT_K
from hybridllm._cli_options import non_negative_int

ROOT = Path(__file__).resolve().parents[1]
PROMPT_SETS = {  # grounded prompts: short passages (50-107 tokens), realistic lengths (153-294)
    "short": ROOT / "bench" / "data" / "speculative_prompts.jsonl",
    "long": ROOT / "bench" / "data" / "speculative_prompts_long.jsonl",
}
_SPEC = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")


def grounded_prompts(n: int, path: Path = PROMPT_SETS["short"]) -> list[str]:
    """n prompts from a JSON lines file, cycled; ValueError naming the line for one that is not a
    JSON object with a non-empty string ``prompt``, or for a file without any."""
    prompts = []
    with path.open(encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                prompt = json.loads(line).get("prompt")
            except (ValueError, AttributeError):
                prompt = None
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError(f"{path}:{no}: not a JSON object with a non-empty \"prompt\"")
            prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return [prompts[i % len(prompts)] for i in range(n)]


def gsm8k_prompts(n: int) -> list[str]:
    out = []
    with GSM8K.open() as f:
        for line in f:
            out.append(json.loads(line)["question"])
            if len(out) >= n:
                break
    return out


def start(cmd: list[str]) -> subprocess.Popen:
    log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe that could fill up
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, text=True)
    proc.log = log  # type: ignore[attr-defined]
    return proc


def ours_cmd(args: argparse.Namespace, gguf: Path, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "cloud_server", "serve", "--model", str(gguf),
           "--served-model-name", "bench", "--port", str(port), "--max-model-len", "2048",
           "--max-num-seqs", "16", "--num-threads", str(args.threads), "--log-level", "warning"]  # fmt: skip
    if args.k is not None:
        cmd += ["--num-speculative-tokens", str(args.k)]
    if args.draft_model:
        cmd += ["--speculative-method", "draft", "--draft-model", args.draft_model]
        if args.draft_vocab_size is not None:
            cmd += ["--draft-vocab-size", str(args.draft_vocab_size)]
        return cmd
    return cmd + ["--speculative-method", "ngram"]


def llama_cmd(args: argparse.Namespace, gguf: Path, port: int, lookup: bool) -> list[str]:
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias",
           "bench", "--port", str(port), "--n_ctx", "2048", "--n_threads", str(args.threads),
           "--n_threads_batch", str(args.threads), "--verbose", "False",
           "--interrupt_requests", "False"]  # fmt: skip
    if lookup:
        cmd += ["--draft_model", "prompt-lookup-decoding",
                "--draft_model_num_pred_tokens", str(args.k or DEFAULT_K["ngram"])]  # fmt: skip
    return cmd


def spec_counters(http: Any) -> dict[str, float]:
    text = http.get("/metrics").text
    out = {}
    for name in _SPEC:
        m = re.search(rf"^hybridllm_{name}_total\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


async def stream(
    http: Any, prompt: str, max_tokens: int, extra: dict[str, Any]
) -> tuple[str, float, float]:
    """(text, seconds from the first to the last content chunk, seconds to the first one)."""
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        **extra,
    }
    first = last = None
    parts: list[str] = []
    sent = time.perf_counter()
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("error"):  # an in-band error cuts the stream: no answer to measure
                raise RuntimeError(f"stream error: {json.dumps(event['error'])[:300]}")
            for choice in event.get("choices", []):
                text = (choice.get("delta") or {}).get("content")
                if text:
                    last = time.perf_counter()
                    first = first or last
                    parts.append(text)
    decode = (last - first) if first and last else 0.0
    return "".join(parts), decode, (first - sent) if first else 0.0


def run_c1(
    modes: dict[str, tuple[str, dict]],
    prompts: list[str],
    args: argparse.Namespace,
    count: Any,
    ours_url: str,
) -> dict[str, Any]:
    """Every prompt through every mode in turn; decode tok/s and acceptance per mode."""
    import httpx

    acc = {m: {"tokens": 0, "seconds": 0.0, "ttft": 0.0, **dict.fromkeys(_SPEC, 0.0)} for m in modes}
    texts: dict[str, list[str]] = {m: [] for m in modes}
    metrics = httpx.Client(base_url=ours_url, timeout=30)  # closed below

    async def go() -> None:
        clients = {url: httpx.AsyncClient(base_url=url, timeout=900) for url, _ in modes.values()}
        try:
            # one unmeasured short answer per mode first: each mode's first steps (the draft
            # model's first decode, first verify shapes) once ran a whole prompt at half speed
            for _mode, (url, extra) in modes.items():
                await stream(clients[url], prompts[0], min(32, args.max_tokens), extra)
            for prompt in prompts:
                # a one-token warm-up on each server first, so every mode meets a warm prefix cache
                # and TTFTs compare (the draft's own prefill is then what the draft mode adds)
                for url, client in clients.items():
                    plain = {"speculative_method": "none"} if url == ours_url else {}
                    await stream(client, prompt, 1, plain)
                for mode, (url, extra) in modes.items():
                    before = spec_counters(metrics) if url == ours_url else None
                    text, seconds, ttft = await stream(clients[url], prompt, args.max_tokens, extra)
                    if before is not None:
                        after = spec_counters(metrics)
                        for name in _SPEC:
                            acc[mode][name] += after[name] - before[name]
                    acc[mode]["tokens"] += max(0, count(text) - 1)
                    acc[mode]["seconds"] += seconds
                    acc[mode]["ttft"] += ttft
                    texts[mode].append(text)
        finally:
            for c in clients.values():
                await c.aclose()

    try:
        asyncio.run(go())
    finally:
        metrics.close()
    out: dict[str, Any] = {}
    for mode, a in acc.items():
        row: dict[str, Any] = {
            "decode_tokens": a["tokens"],
            "decode_s": round(a["seconds"], 2),
            # None where no time passed from the first to the last chunk (one chunk per answer):
            # tokens over a floor of 1 ns made billions of tokens/s
            "decode_tok_s": round(a["tokens"] / a["seconds"], 2) if a["seconds"] else None,
            # time to the first token, and the whole request (TTFT + decode), means per prompt
            "mean_ttft_s": round(a["ttft"] / len(prompts), 3),
            "mean_request_s": round((a["ttft"] + a["seconds"]) / len(prompts), 3),
        }
        if a["spec_decode_num_draft_tokens"]:
            row["acceptance_rate"] = round(
                a["spec_decode_num_accepted_tokens"] / a["spec_decode_num_draft_tokens"], 3
            )
            row["mean_acceptance_length"] = round(
                1 + a["spec_decode_num_accepted_tokens"] / a["spec_decode_num_drafts"], 2
            )
            row["num_drafts"] = int(a["spec_decode_num_drafts"])
        out[mode] = row
    if "off" in texts:
        for mode in texts:
            if mode.startswith("ours_") or mode in ("ngram", "draft"):
                out[mode]["same_text_as_off"] = sum(
                    a == b for a, b in zip(texts[mode], texts["off"], strict=True)
                )
    return out


def run_c16(
    url: str, prompts: list[str], args: argparse.Namespace, count: Any, method: str
) -> dict[str, Any]:
    import httpx

    async def go() -> tuple[int, float]:
        limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
        async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as http:
            start_t = time.perf_counter()
            results = await asyncio.gather(
                *(stream(http, p, args.max_tokens, {"speculative_method": method}) for p in prompts)
            )
            wall = time.perf_counter() - start_t
        return sum(count(t) for t, _, _ in results), wall

    tokens, wall = asyncio.run(go())
    return {"output_tokens": tokens, "wall_s": round(wall, 2), "output_tok_s": round(tokens / wall, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.speculative", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="catalog id or .gguf")
    parser.add_argument("--draft-model", default=None, help="also measure draft-model drafting")
    parser.add_argument("--draft-vocab-size", type=non_negative_int, default=None,
                        help="the server's --draft-vocab-size (default: the server's own, 32768)")
    parser.add_argument("--num-prompts", type=positive_int, default=8,
                        help="grounded prompts measured (default 8)")
    parser.add_argument("--prompts", default="short",
                        help="grounded prompt set: short, long, or a JSON lines file (field prompt)")
    parser.add_argument("--max-tokens", type=positive_int, default=96, help="tokens per answer (default 96)")
    parser.add_argument(
        "--k", type=positive_int, default=None,
        help="--num-speculative-tokens of both servers (default: ours its own, 8 for prompt "
        "lookup and 3 for a draft model; llama-cpp-python's prompt lookup 8 as well)",
    )
    parser.add_argument("--threads", type=positive_int, default=os.cpu_count() or 2,
                        help="CPU threads of each server (default: all cores)")
    parser.add_argument("--skip-llama-cpp", action="store_true", help="measure our server only")
    parser.add_argument("--skip-c16", action="store_true", help="leave out the run at concurrency 16")
    args = parser.parse_args(argv)
    args.prompts = PROMPT_SETS.get(args.prompts) or Path(args.prompts)
    if not args.prompts.is_file():
        parser.error(f"--prompts: no such set or file: {args.prompts} (sets: {', '.join(PROMPT_SETS)})")
    try:  # a bad prompt file is a usage error before any server starts, not a traceback after
        grounded = grounded_prompts(args.num_prompts, args.prompts)
    except (OSError, ValueError) as exc:
        parser.error(f"--prompts: {exc}")

    import httpx

    gguf = model_gguf(parser, "--model", args.model)
    if args.draft_model:
        args.draft_model = str(model_gguf(parser, "--draft-model", args.draft_model))
    count = token_counter(gguf)

    report: dict[str, Any] = {
        "model": gguf.name,
        "draft_model": Path(args.draft_model).name if args.draft_model else None,
        "draft_vocab_size": args.draft_vocab_size,
        "k": args.k or DEFAULT_K["draft" if args.draft_model else "ngram"],
        "prompts": args.prompts.name,
        "num_prompts": args.num_prompts,
        "max_tokens": args.max_tokens,
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "loadavg_1m_start": round(os.getloadavg()[0], 2),
    }
    procs: dict[str, subprocess.Popen] = {}
    urls: dict[str, str] = {}
    try:
        names = ["ours"] + ([] if args.skip_llama_cpp else ["llama_cpp", "llama_cpp_lookup"])
        for name in names:
            port = free_port()
            urls[name] = f"http://127.0.0.1:{port}"
            cmd = (
                ours_cmd(args, gguf, port)
                if name == "ours"
                else llama_cmd(args, gguf, port, lookup=name == "llama_cpp_lookup")
            )
            procs[name] = start(cmd)
            report[f"{name}_startup_s"] = round(wait_ready(urls[name], procs[name], 900), 1)
        for url in urls.values():  # warm-up
            httpx.post(
                f"{url}/v1/chat/completions",
                timeout=900,
                json={"model": "bench", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            )
        ours = urls["ours"]
        method = "draft" if args.draft_model else "ngram"
        modes = {"off": (ours, {"speculative_method": "none"})}
        modes["ngram"] = (ours, {"speculative_method": "ngram"})
        if args.draft_model:
            modes["draft"] = (ours, {"speculative_method": "draft"})
        if not args.skip_llama_cpp:
            modes["llama_cpp"] = (urls["llama_cpp"], {})
            modes["llama_cpp_lookup"] = (urls["llama_cpp_lookup"], {})
        c1 = run_c1(modes, grounded, args, count, ours)
        report["c1_grounded"] = c1
        ratios = {
            f"{m}_over_off": ratio(c1[m]["decode_tok_s"], c1["off"]["decode_tok_s"])
            for m in c1
            if m != "off"
        }
        if not args.skip_llama_cpp:
            ratios["llama_cpp_lookup_over_llama_cpp"] = ratio(
                c1["llama_cpp_lookup"]["decode_tok_s"], c1["llama_cpp"]["decode_tok_s"]
            )
            ratios["ngram_over_llama_cpp_lookup"] = ratio(
                c1["ngram"]["decode_tok_s"], c1["llama_cpp_lookup"]["decode_tok_s"]
            )
        report["loadavg_1m_after_c1"] = round(os.getloadavg()[0], 2)
        if args.draft_model and GSM8K.is_file():
            gsm = run_c1(
                {"off": modes["off"], "draft": modes["draft"]},
                gsm8k_prompts(args.num_prompts),
                args,
                count,
                ours,
            )
            report["c1_gsm8k"] = gsm
            ratios["gsm8k_draft_over_off"] = ratio(gsm["draft"]["decode_tok_s"], gsm["off"]["decode_tok_s"])
        if not args.skip_c16:
            prompts = grounded_prompts(16, args.prompts)
            off = run_c16(ours, prompts, args, count, "none")
            on = run_c16(ours, prompts, args, count, method)
            report["c16_grounded"] = {"off": off, method: on}
            ratios[f"c16_{method}_over_off"] = ratio(on["output_tok_s"], off["output_tok_s"])
        report["ratios"] = ratios
        report["ours_peak_rss_mb"] = peak_rss(procs["ours"])
    except (RuntimeError, TimeoutError, httpx.HTTPError) as exc:
        # a server that fails mid-run: say why and keep what was measured, not a traceback
        report["error"] = f"{type(exc).__name__}: {exc}"
        print(f"bench.speculative: {report['error']}", file=sys.stderr)
    finally:
        for proc in procs.values():
            stop_server(proc)
    report["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report, indent=None if args.json else 2))
    return 1 if "error" in report else 0


if __name__ == "__main__":
    sys.exit(main())
