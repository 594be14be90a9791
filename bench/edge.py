"""The SDK's edge path against raw llama-cpp-python, same model, prompts and settings, one run.

    python -m bench.edge [--json] [--model ID] [--rounds 3] [--max-tokens 64]

Both sides stream a greedy chat answer. Runs alternate SDK / raw per prompt so that machine noise
hits both alike; per side we report the median TTFT and the aggregate decode tokens/s (tokens
after the first over the time after the first), and the ratios SDK / raw.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

PROMPTS = [
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Give me three tips for writing clean Python code.",
    "Write a short poem about autumn leaves.",
    "What are the main differences between a list and a tuple in Python?",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
    "How do I boil an egg?",
    "Name five animals that live in the ocean.",
]


def _measure(chunks) -> tuple[float, float, int]:
    """(TTFT s, decode s, tokens) of a stream of text pieces (one per token)."""
    start = time.perf_counter()
    first = last = None
    n = 0
    for text in chunks:
        if not text:
            continue
        now = time.perf_counter()
        first = first or now
        last = now
        n += 1
    if first is None:
        return float("nan"), 0.0, 0
    return first - start, last - first, n


def run(model: str, rounds: int, max_tokens: int) -> dict:
    from llama_cpp import Llama

    from hybridllm import HybridLLM
    from hybridllm.models import resolve_gguf

    _, path, _ = resolve_gguf(model)
    threads = os.cpu_count() or 1
    sdk = HybridLLM(edge_model=str(path), n_ctx=2048, n_threads=threads, cache=False)
    raw = Llama(model_path=str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                n_batch=512, verbose=False)
    settings = {"max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0, "seed": 0}

    def sdk_side(prompt: str):
        return (c.text for c in sdk.stream(prompt, **settings))

    # the same conversation on both sides: the SDK adds the catalog's default system prompt
    system = getattr(sdk.edge, "system_prompt", None)
    prefix = [{"role": "system", "content": system}] if system else []

    def raw_side(prompt: str):
        out = raw.create_chat_completion(
            [*prefix, {"role": "user", "content": prompt}], stream=True, max_tokens=max_tokens,
            temperature=0.0, top_p=1.0, seed=0,
        )
        return (c["choices"][0]["delta"].get("content") or "" for c in out)

    results: dict[str, list[tuple[float, float, int]]] = {"sdk": [], "raw": []}
    # warm-up: load both, fill caches
    _measure(sdk_side(PROMPTS[0]))
    _measure(raw_side(PROMPTS[0]))
    for r in range(rounds):
        for i, prompt in enumerate(PROMPTS):
            order = [("sdk", sdk_side), ("raw", raw_side)]
            if (i + r) % 2:
                order.reverse()
            for name, side in order:
                results[name].append(_measure(side(prompt)))
    sdk.close()
    raw.close()

    def summary(rows):
        decode_s = sum(d for _, d, _ in rows)
        tokens = sum(max(n - 1, 0) for _, _, n in rows)
        return {"ttft_ms_p50": round(statistics.median(t for t, _, _ in rows) * 1000, 2),
                "decode_tokens_per_s": round(tokens / decode_s, 1), "tokens": tokens}

    s, w = summary(results["sdk"]), summary(results["raw"])
    return {
        "bench": "edge", "model": model, "threads": threads, "prompts": len(PROMPTS),
        "rounds": rounds, "max_tokens": max_tokens, "sdk": s, "raw_llama_cpp": w,
        "decode_tps_ratio_sdk_over_raw": round(s["decode_tokens_per_s"] / w["decode_tokens_per_s"], 3),
        "ttft_ratio_sdk_over_raw": round(s["ttft_ms_p50"] / w["ttft_ms_p50"], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    result = run(args.model, args.rounds, args.max_tokens)
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
