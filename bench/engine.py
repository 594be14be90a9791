"""The cloud engine on CPU: continuous batching, prefix caching, KV memory, bandwidth bound.

    python -m bench.engine [--json] [--model ID] [--requests 32] [--max-tokens 64] [--device cpu|cuda]

One run, SmolLM2-135M-Instruct, GSM8K questions from ../shared/data (built-in fallbacks when
absent) through the model's chat template, ``ignore_eos`` so every request writes exactly
``max_tokens`` tokens:
- ``throughput_ratio``: aggregate output tokens/s with all requests submitted at once and up to
  16 running together, over tokens/s when the same kind of request runs one at a time
  (``--sequential`` of them, to keep the run short; per-request cost does not depend on count).
- ``ttft_speedup``: time to first token with a ~1,000-token shared system prompt, cold (prefix
  cache emptied before each request) over warm (the system prompt's blocks already cached);
  medians over ``--ttft-rounds`` questions.
- ``kv_unused_at_peak``: at the step with the most KV slots allocated, the fraction of them that
  hold no computed token (blocks are taken on demand, so only each sequence's tail is unused).
- ``single_stream_tokens_per_s`` next to ``bandwidth_bound_tokens_per_s`` = measured memory
  bandwidth (numpy copy) / bytes of the weights as stored (``weight_bytes``: codes and scales, int4
  groups and int8 groups with the CPU default, ``quantization``): each decoded token must read
  every weight once.
``--device cuda`` runs the same on a GPU (bf16 weights, CUDA graphs; the bandwidth is then a
device-to-device copy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from hybridllm._cli_options import positive_int

# torch's default OpenMP wait policy, as the server runs: with OMP_WAIT_POLICY=PASSIVE (workers
# sleep between ops) a SmolLM2 decode step takes about twice as long (34-41 vs 18 ms a token).

GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "routellm" / (
    "gsm8k_train_questions.jsonl"
)
FALLBACK = [
    "A baker makes 24 muffins and sells 3/4 of them. How many are left?",
    "Tom has 5 apples and buys 7 more. He gives 4 away. How many does he have?",
    "A train travels 60 miles per hour for 3 hours. How far does it go?",
    "Sara saves $15 a week. How many weeks until she has $120?",
]


def load_questions(n: int, offset: int = 0) -> list[str]:
    if GSM8K.is_file():
        with GSM8K.open() as f:
            qs = [json.loads(line)["question"] for _, line in zip(range(offset + n), f, strict=False)]
        return qs[offset:]
    return [FALLBACK[i % len(FALLBACK)] + f" (case {i})" for i in range(offset, offset + n)]


def stored_weight_bytes(model) -> int:
    """Bytes of every weight, scale, bias and norm tensor as the engine holds them (shared once)."""
    import torch

    seen: dict[int, int] = {}
    for module in model.modules():
        for name in ("weight", "scale", "bias"):
            t = getattr(module, name, None)
            if isinstance(t, torch.Tensor):
                seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def memory_bandwidth_gbps(device=None, rounds: int = 5) -> float:
    """Best of a few copies of a large buffer, read + write bytes per second: numpy on the CPU
    (256 MiB), a device-to-device copy on CUDA (1 GiB)."""
    if device is not None and device.type == "cuda":
        import torch

        num_bytes = 1 << 30
        src = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
        copy, sync = (lambda: dst.copy_(src)), (lambda: torch.cuda.synchronize(device))
    else:
        import numpy as np

        num_bytes = 256 << 20
        src = np.ones(num_bytes // 8, dtype=np.float64)
        copy, sync = (lambda: np.copyto(dst, src)), (lambda: None)
    dst = src.copy()
    best = float("inf")
    for _ in range(rounds):
        sync()
        t = time.perf_counter()
        copy()
        sync()
        best = min(best, time.perf_counter() - t)
    return 2 * num_bytes / best / 1e9


def run_batch(engine, prompts: list[str], params) -> tuple[int, float]:
    t = time.perf_counter()
    results = engine.generate(prompts, params)
    return sum(len(r.token_ids) for r in results), time.perf_counter() - t


def ttft(engine, prompt: str, params) -> float:
    t = time.perf_counter()
    engine.add_request(f"ttft-{time.monotonic_ns()}", prompt, params)
    while True:
        outs = engine.step()
        if outs:
            return time.perf_counter() - t


def system_prompt(tokenizer, target_tokens: int = 1000) -> str:
    header = "You are a careful math tutor. Here are worked questions for reference:\n"
    parts, qs, i = [header], load_questions(200, offset=1000), 0
    while len(tokenizer.encode("".join(parts), add_special=False)) < target_tokens:
        parts.append(f"Example {i + 1}: {qs[i % len(qs)]}\n")
        i += 1
    return "".join(parts)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object only")
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="catalog id or .gguf (default smollm2-135m-instruct)")
    ap.add_argument("--requests", type=positive_int, default=32, help="GSM8K requests, batched (default 32)")
    ap.add_argument("--max-tokens", type=positive_int, default=64, help="tokens per request (default 64)")
    ap.add_argument("--concurrency", type=positive_int, default=16,
                    help="sequences batched at once (default 16)")
    ap.add_argument("--sequential", type=positive_int, default=3,
                    help="requests run one at a time (default 3)")
    ap.add_argument("--ttft-rounds", type=positive_int, default=3,
                    help="prompts timed cold and warm (default 3)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    args = ap.parse_args(argv)

    import torch

    from cloud_server.config import EngineConfig
    from cloud_server.engine.llm_engine import LLMEngine
    from cloud_server.engine.sampling_params import SamplingParams

    t0 = time.perf_counter()
    from cloud_server.exceptions import ServerError

    try:
        engine = LLMEngine(EngineConfig(args.model, max_num_seqs=args.concurrency, device=args.device))
    except ServerError as exc:  # --device cuda without CUDA, a bad model: one line, no traceback
        ap.error(str(exc))
    load_s = time.perf_counter() - t0
    tok = engine.tokenizer
    chat = [tok.apply_chat_template([{"role": "user", "content": q}])
            for q in load_questions(args.requests)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    run_batch(engine, chat[:1], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up

    # 1. one at a time, then all at once (fresh prefix cache each, so no cross-help)
    engine.block_manager.reset_prefix_cache()
    seq_tokens, seq_s = 0, 0.0
    for prompt in chat[: args.sequential]:
        n, s = run_batch(engine, [prompt], params)
        seq_tokens, seq_s = seq_tokens + n, seq_s + s
    single_tps = seq_tokens / seq_s
    engine.block_manager.reset_prefix_cache()
    engine.reset_stats()
    conc_tokens, conc_s = run_batch(engine, chat, params)
    st = engine.stats()
    conc_tps = conc_tokens / conc_s
    unused = st["kv_unused_slots_at_peak"] / max(1, st["kv_peak_allocated_slots"])

    # 2. TTFT with a shared ~1000-token system prompt, cold vs warm
    sys_prompt = system_prompt(tok)
    sys_tokens = len(tok.encode(sys_prompt, add_special=False))
    qs = load_questions(2 * args.ttft_rounds, offset=500)
    one = SamplingParams(temperature=0.0, max_tokens=1)

    def chat_with_system(q: str) -> str:
        return tok.apply_chat_template(
            [{"role": "system", "content": sys_prompt}, {"role": "user", "content": q}])

    cold = []
    for q in qs[: args.ttft_rounds]:
        engine.block_manager.reset_prefix_cache()
        cold.append(ttft(engine, chat_with_system(q), one))
    ttft(engine, chat_with_system(qs[0]), one)  # make sure the system prompt is cached
    warm = [ttft(engine, chat_with_system(q), one) for q in qs[args.ttft_rounds :]]
    ttft_cold, ttft_warm = statistics.median(cold), statistics.median(warm)

    # 3. bandwidth bound for the weights as stored (int4 / int8 groups + scales by default on CPU)
    weight_bytes = stored_weight_bytes(engine.runner.model)
    bw = memory_bandwidth_gbps(engine.device)
    bound = bw * 1e9 / weight_bytes

    result = {
        "model": engine.model_name,
        "device": str(engine.device),
        "threads": torch.get_num_threads(),
        "load_s": round(load_s, 2),
        "num_requests": args.requests,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "concurrent_tokens_per_s": round(conc_tps, 2),
        "concurrent_output_tokens": conc_tokens,
        "max_batch_num_seqs": st["max_batch_num_seqs"],
        "num_preemptions": st["num_preemptions"],
        "sequential_requests": args.sequential,
        "sequential_tokens_per_s": round(single_tps, 2),
        "throughput_ratio": round(conc_tps / single_tps, 2),
        "system_prompt_tokens": sys_tokens,
        "ttft_cold_s": round(ttft_cold, 4),
        "ttft_warm_s": round(ttft_warm, 4),
        "ttft_speedup": round(ttft_cold / ttft_warm, 2),
        "kv_peak_allocated_slots": st["kv_peak_allocated_slots"],
        "kv_unused_slots_at_peak": st["kv_unused_slots_at_peak"],
        "kv_unused_at_peak": round(unused, 4),
        "single_stream_tokens_per_s": round(single_tps, 2),
        "memory_bandwidth_gbps": round(bw, 2),
        "quantization": engine.quantization,
        "dtype": str(engine.dtype).removeprefix("torch."),
        "weight_bytes": weight_bytes,
        "bandwidth_bound_tokens_per_s": round(bound, 2),
        "single_stream_fraction_of_bound": round(single_tps / bound, 3),
        "meets": {
            "throughput_ratio_ge_4": conc_tps / single_tps >= 4,
            "ttft_speedup_ge_5": ttft_cold / ttft_warm >= 5,
            "kv_unused_lt_5pct": unused < 0.05,
        },
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:34s} {v}")


if __name__ == "__main__":
    main()
