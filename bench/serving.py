"""Serving benchmark: this cloud server versus llama-cpp-python's server, same GGUF, same load.

    python -m bench.serving [--json] [--num-requests 64] [--concurrency 1 16] [--max-tokens 32]

Each server runs alone on 127.0.0.1 (one after the other, so they never share the CPU). For each
concurrency level, ``--num-requests`` streamed chat completions (temperature 0, GSM8K questions
from ../shared/data when present) are sent by that many concurrent clients. Output tokens are
counted by re-tokenizing every answer with llama.cpp's vocabulary, the same way for both servers,
so neither server's own usage report is trusted. Reported per server and level: aggregate output
tokens/s (all output tokens / wall time), p50 and p95 TTFT (request sent -> first content
chunk), each server's peak resident memory (``peak_rss_mb``, VmHWM), and the ratios
ours / llama-cpp-python. ``--quantization`` passes our server's weight format (default: its own).
A server that fails mid-run (an HTTP error, an in-band stream error, a dropped connection, no
output token at all) ends the run with exit status 1: the report so far with an ``error``, no ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridllm._cli_options import positive_int  # a concurrency of 0 would wait forever

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT.parent / "shared" / "data" / "routellm" / "gsm8k_train_questions.jsonl"
FALLBACK_PROMPTS = [
    "Explain why the sky is blue in two sentences.",
    "Write a short poem about the sea.",
    "What are three uses of a paperclip?",
    "Summarize the plot of Romeo and Juliet.",
]


@dataclass
class Result:
    num_tokens: int
    ttft_s: float


def load_prompts(n: int) -> list[str]:
    prompts: list[str] = []
    if GSM8K.is_file():
        with GSM8K.open() as f:
            for line in f:
                prompts.append(json.loads(line)["question"])
                if len(prompts) >= n:
                    break
    if not prompts:
        prompts = FALLBACK_PROMPTS
    return [prompts[i % len(prompts)] for i in range(n)]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(kind: str, gguf: Path, port: int, threads: int, max_num_seqs: int,
                 quantization: str | None = None) -> subprocess.Popen:
    if kind == "hybridllm":
        cmd = [
            sys.executable, "-m", "cloud_server", "serve", "--model", str(gguf),
            "--served-model-name", "bench", "--host", "127.0.0.1", "--port", str(port),
            "--max-num-seqs", str(max_num_seqs), "--max-model-len", "2048",
            "--num-threads", str(threads), "--log-level", "warning",
        ]  # fmt: skip
        if quantization:
            cmd += ["--quantization", quantization]
    else:
        cmd = [
            sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
            "--model_alias", "bench", "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", "2048", "--n_threads", str(threads), "--n_threads_batch", str(threads),
            "--verbose", "False", "--interrupt_requests", "False",
        ]  # fmt: skip
    # stderr to a file, not a pipe: an unread pipe that fills up would stall the server.
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, text=True)
    proc.log = log  # type: ignore[attr-defined]
    return proc


def server_log(proc: subprocess.Popen) -> str:
    log = proc.log  # type: ignore[attr-defined]
    log.seek(0)
    return log.read()[-2000:]


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 300) -> float:
    import httpx

    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {server_log(proc)}")
        try:
            # Our server answers /v1/models while its weights still load; /health says 200 only
            # once it can serve (503 before). llama-cpp-python's server has no /health (404).
            health = httpx.get(f"{url}/health", timeout=2).status_code
            if health == 200 or (
                health == 404 and httpx.get(f"{url}/v1/models", timeout=2).status_code == 200
            ):
                return time.monotonic() - start
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout_s}s")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    log = getattr(proc, "log", None)  # its stderr file (start_server's, bench.speculative's)
    if log is not None:
        log.close()


async def one_request(http: Any, prompt: str, max_tokens: int, count: Any) -> Result:
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    sent = time.perf_counter()
    ttft: float | None = None
    parts: list[str] = []
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("error"):  # an in-band error cuts the stream: no answer to count
                raise RuntimeError(f"stream error: {json.dumps(event['error'])[:300]}")
            for choice in event.get("choices", []):
                text = (choice.get("delta") or {}).get("content")
                if text:
                    ttft = ttft if ttft is not None else time.perf_counter() - sent
                    parts.append(text)
    return Result(count("".join(parts)), ttft if ttft is not None else time.perf_counter() - sent)


async def run_level(
    url: str, prompts: list[str], concurrency: int, max_tokens: int, count: Any
) -> dict[str, Any]:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:

        async def bounded(prompt: str) -> Result:
            async with sem:
                return await one_request(http, prompt, max_tokens, count)

        start = time.perf_counter()
        results = await asyncio.gather(*(bounded(p) for p in prompts))
        wall = time.perf_counter() - start
    ttfts = sorted(r.ttft_s for r in results)
    num_tokens = sum(r.num_tokens for r in results)
    if not num_tokens:  # empty answers only: no throughput or TTFT to compare
        raise RuntimeError(f"no output tokens in {len(results)} answers")
    return {
        "concurrency": concurrency,
        "num_requests": len(results),
        "output_tokens": num_tokens,
        "wall_s": round(wall, 3),
        "output_tok_s": round(num_tokens / wall, 2),
        "ttft_p50_s": round(statistics.median(ttfts), 4),
        "ttft_p95_s": round(nearest_rank(ttfts, 95), 4),
    }


def nearest_rank(ordered: list[float], q: int) -> float:
    """The q-th percentile of sorted values by nearest rank: the smallest value with at least q%
    of the values at or below it (the 19th of 20 for p95, not the maximum)."""
    return ordered[max(0, -(-len(ordered) * q // 100) - 1)]


def bench_server(kind: str, args: argparse.Namespace, gguf: Path, count: Any) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(kind, gguf, port, args.threads, max(args.concurrency), args.quantization)
    try:
        load_s = wait_ready(url, proc)
        warm = load_prompts(2)
        asyncio.run(run_level(url, warm, 2, 8, count))
        levels = {}
        for c in args.concurrency:
            prompts = load_prompts(args.num_requests)
            levels[str(c)] = asyncio.run(run_level(url, prompts, c, args.max_tokens, count))
            if not args.json:
                print(f"{kind:>10} c={c:<3} {levels[str(c)]}", file=sys.stderr)
        peak_rss_mb = peak_rss(proc)
    finally:
        stop_server(proc)
    return {"startup_s": round(load_s, 2), "peak_rss_mb": peak_rss_mb, "levels": levels}


def peak_rss(proc: subprocess.Popen) -> float | None:
    """The server process's peak resident memory (VmHWM) in MB, where /proc has it."""
    try:
        status = Path(f"/proc/{proc.pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def model_gguf(parser: argparse.ArgumentParser, option: str, model: str) -> Path:
    """The .gguf an option names: a file, else a catalog id, pulled. An unknown id (or one that
    cannot be copied) is a one-line usage error, exit 2, before any server starts."""
    from hybridllm._exceptions import ModelError
    from hybridllm.models import pull

    if Path(model).is_file():
        return Path(model)
    try:
        return pull(model)
    except ModelError as exc:
        parser.error(f"{option}: {exc}")


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None where either side measured nothing (a 0 would divide by zero or give 0x)."""
    return round(a / b, 3) if a and b else None


def token_counter(gguf: Path) -> Any:
    """Counts the tokens of a text with the GGUF's own vocabulary (llama.cpp's, loaded quietly),
    so every server's output is counted alike."""
    from cloud_server.models.tokenizer import GGUFTokenizer

    vocab = GGUFTokenizer(gguf)
    return lambda text: len(vocab.encode(text, add_special=False)) if text else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="catalog id or .gguf path")
    parser.add_argument("--num-requests", type=positive_int, default=64,
                        help="GSM8K requests per level (default 64)")
    parser.add_argument("--concurrency", type=positive_int, nargs="+", default=[1, 16],
                        help="concurrency levels (default 1 16)")
    parser.add_argument("--max-tokens", type=positive_int, default=32, help="tokens per request (default 32)")
    parser.add_argument("--threads", type=positive_int, default=os.cpu_count() or 2,
                        help="CPU threads of each server (default: all cores)")
    parser.add_argument("--quantization", choices=["none", "int8", "int4"], default=None,
                        help="our server's weights (default: the server's own choice)")
    parser.add_argument("--servers", nargs="+", default=["hybridllm", "llama_cpp"],
                        choices=["hybridllm", "llama_cpp"],
                        help="servers to measure (default both)")  # fmt: skip
    args = parser.parse_args(argv)

    gguf = model_gguf(parser, "--model", args.model)
    count = token_counter(gguf)

    report: dict[str, Any] = {
        "model": gguf.name,
        "num_requests": args.num_requests,
        "max_tokens": args.max_tokens,
        "threads": args.threads,
        "prompts": "gsm8k" if GSM8K.is_file() else "builtin",
        "cpu_count": os.cpu_count(),
        "loadavg_1m_start": round(os.getloadavg()[0], 2),
    }
    import httpx

    for kind in args.servers:
        try:
            report[kind] = bench_server(kind, args, gguf, count)
        except (RuntimeError, TimeoutError, httpx.HTTPError) as exc:
            # a server that fails mid-run: say which and why, keep what was measured, no ratios
            report["error"] = f"{kind} failed: {type(exc).__name__}: {exc}"
            print(f"bench.serving: {report['error']}", file=sys.stderr)
            print(json.dumps(report, indent=None if args.json else 2))
            return 1
    # Other processes on the machine skew both servers; the load average says how much.
    report["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    if "hybridllm" in report and "llama_cpp" in report:
        ratios = {}
        for c in args.concurrency:
            ours, theirs = (
                report["hybridllm"]["levels"][str(c)],
                report["llama_cpp"]["levels"][str(c)],
            )
            # rounded figures can be 0 (a TTFT under 50 us): null, not a ZeroDivisionError
            ratios[f"throughput_c{c}"] = ratio(ours["output_tok_s"], theirs["output_tok_s"])
            ratios[f"ttft_p50_c{c}"] = ratio(ours["ttft_p50_s"], theirs["ttft_p50_s"])
            ratios[f"ttft_p95_c{c}"] = ratio(ours["ttft_p95_s"], theirs["ttft_p95_s"])
        report["ratios_ours_over_llama_cpp"] = ratios
    print(json.dumps(report, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
