"""The routed demo behind `make run`.

Starts `hybridllm-cloud serve` in the background, waits for it to be healthy, sends a scripted set
of requests through HybridLLM (small talk, math and proofs, a paraphrased repeat, one with an
e-mail address, one while the cloud is stopped), prints how each was served, and stops the server.
The router runs at its shipped threshold, as an application gets it.

    python -m hybridllm.demo [--cloud-model ID]     (or HYBRIDLLM_DEMO_CLOUD_MODEL=ID make run)

By default the cloud serves the device's own SmolLM2-135M (it starts in seconds), so only the routes
differ; ``--cloud-model qwen2.5-coder-1.5b-instruct`` serves Qwen2.5-Coder-1.5B-Instruct (about two
minutes to start on a CPU, slower answers) so that the answers differ too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._config import DEFAULT_EDGE_MODEL
from ._exceptions import HybridLLMError
from ._progress import ProgressBar

EASY = [
    "What is the capital of France?",
    "Say hello in Spanish.",
    "How can I improve my English?",
    "Name three fruits.",
]
HARD = [
    "A store sells pens at 3 for $2. How much do 27 pens cost? Explain step by step.",
    "Which enzyme unwinds DNA during replication? A. ligase B. helicase C. primase D. polymerase",
    "Prove that the sum of two odd integers is always even.",
    "In contract law, what is the difference between an offer and an invitation to treat?",
]
PARAPHRASE = "How do I improve my English?"  # the cache's verifier accepts it (probability 0.98)
# The cache stores only whole answers, and max_tokens is part of its key: the question the
# paraphrase repeats, and the paraphrase, get room to finish (the device's answer ran to 264
# tokens; at the demo's 48 it was cut, never stored, and the paraphrase was answered again).
WHOLE = {EASY[2]: 384, PARAPHRASE: 384}
PRIVATE = "My email is jane.doe@example.com. Can you suggest a subject line for a thank-you note?"
# a question the router sends to the cloud and the cache has not seen: with the cloud stopped, the
# device must answer it instead (route EDGE_FALLBACK)
WHILE_DOWN = (
    "A farmer has 12 cows. Each cow gives 8 liters of milk a day and he sells milk at "
    "$2 a liter. How much does he earn in a week?"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_cloud(port: int, log: Path, model: str = DEFAULT_EDGE_MODEL) -> subprocess.Popen:
    import httpx

    exe = shutil.which("hybridllm-cloud")
    cmd = [exe] if exe else [sys.executable, "-m", "cloud_server"]
    with log.open("w") as out:  # the server holds its own copy of the descriptor
        proc = subprocess.Popen(
            [*cmd, "serve", "--model", model, "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                reason = _last_line(log)
                raise HybridLLMError(f"the cloud server exited ({proc.returncode})"
                                     f"{': ' + reason if reason else ''}; its log is {log}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return proc
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise HybridLLMError(f"the cloud server did not become healthy in 600 s; see {log}")
    except BaseException:  # Ctrl-C while it loads too: no server is left running behind the demo
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        raise


def _last_line(log: Path) -> str:
    """The last line the server wrote (its error, when it stops at once), or ''."""
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip()[:500] if lines else ""


def _row(prompt: str, c: Any) -> str:  # c: a Completion
    text = " ".join(c.text.split())
    return f"{prompt[:38]:<39}{c.route:<25}{c.latency_ms:>8.0f}  {c.reason[:44]:<45}{text[:40]}"


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m hybridllm.demo", description="the routed demo")
    ap.add_argument(
        "--cloud-model",
        default=os.environ.get("HYBRIDLLM_DEMO_CLOUD_MODEL") or DEFAULT_EDGE_MODEL,
        help="catalog id the demo's cloud server serves (default: the edge's own "
        f"{DEFAULT_EDGE_MODEL}; qwen2.5-coder-1.5b-instruct for a stronger cloud)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from .cli import _drop_stdout

    try:
        try:
            return _demo(argv)
        finally:  # what is still buffered goes now, while a closed pipe can be caught
            if sys.stdout is not None:
                sys.stdout.flush()
    except KeyboardInterrupt:  # Ctrl-C during `make run`: one line, as the hybridllm command does
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `python -m hybridllm.demo | head`: the reader has what it wanted and the server is
        # stopped by now; end quietly with 0, as the hybridllm command does (was a traceback)
        _drop_stdout()
        return 0


def _demo(argv: list[str] | None) -> int:
    from ._client import HybridLLM
    from ._pipeline.execute import EDGE_FALLBACK
    from .cli import missing_server_module, server_extra_hint
    from .router import load_router

    args = _args(argv)
    missing = missing_server_module()
    if missing is not None:  # the light install: say what to add, in one line, before starting
        print(f"error: the demo starts a local cloud server, and {server_extra_hint(missing)} "
              "Without it, `hybridllm ask` and `hybridllm chat` answer on the device.", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="hybridllm-demo-"))
    port = _free_port()
    started = time.monotonic()
    print(
        f"Starting the cloud server (hybridllm-cloud serve --model {args.cloud_model}, in PyTorch)...",
        flush=True,
    )
    try:
        server = _start_cloud(port, work / "cloud.log", args.cloud_model)
    except HybridLLMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        router = load_router()
        print(
            f"Cloud ready in {time.monotonic() - started:.0f} s. Router at its shipped "
            f"threshold {router.threshold:.3f}: the score of each prompt is in REASON.\n",
            flush=True,
        )
        llm = HybridLLM(
            cloud_url=f"http://127.0.0.1:{port}",
            cache_path=str(work / "cache.db"),
            temperature=0.0,
            max_tokens=48,
            seed=0,
            cloud_max_retries=0,
            progress=ProgressBar("Preparing the edge model"),
        )
        with llm:
            print(f"{'PROMPT':<39}{'ROUTE':<25}{'LAT ms':>8}  {'REASON':<45}ANSWER")
            for prompt in EASY + HARD + [PARAPHRASE, EASY[0], PRIVATE]:
                kw = {"max_tokens": WHOLE[prompt]} if prompt in WHOLE else {}
                print(_row(prompt, llm.chat(prompt, **kw)), flush=True)
            server.kill()
            server.wait(timeout=30)
            down = llm.chat(WHILE_DOWN, cache=False)
            print(_row(WHILE_DOWN + " (cloud stopped)", down))
            if down.route != EDGE_FALLBACK:
                print(
                    f"note: the router sent this request to {down.route!r}, so no fallback was needed",
                    flush=True,
                )
            s = llm.stats()
        print(
            f"\n{s['requests']} requests: cache hit rate {s['cache_hit_rate']:.0%}, cloud "
            f"fraction {s['cloud_fraction']:.0%}, cloud tokens {s['cloud_tokens']}, "
            f"cost saved vs cloud-only ${s['cost_saved_vs_cloud_only_usd']:.4f}. "
            f"Total {time.monotonic() - started:.0f} s."
        )
        return 0
    except HybridLLMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if os.environ.get("HYBRIDLLM_DEMO_LOG"):
        import logging

        logging.basicConfig(level=logging.INFO)
    sys.exit(main())
