"""The edge runtimes side by side, same models, prompts and settings, one run.

    python -m bench.edge [--json] [--models smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct]
                         [--rounds 2] [--max-tokens 64] [--backends llama_cpp,onnx] [--threads N]

Four sides per model, each streaming a greedy chat answer to the same conversation (the catalog's
default system prompt + the question):

    raw_llama_cpp   llama-cpp-python's create_chat_completion(stream=True) on the GGUF
    sdk_llama_cpp   HybridLLM(edge_backend="llama_cpp").stream  (cache off, device only)
    raw_onnx        onnxruntime-genai's own loop (generate_next_token + TokenizerStream) on the
                    prepared int4 folder, on the same loaded model as sdk_onnx
    sdk_onnx        HybridLLM(edge_backend="onnx").stream

Runs rotate the side order per prompt so machine noise hits all alike. Per side: median TTFT and
aggregate decode tokens/s (pieces after the first over the time after the first; null when no
answer had a second piece); an empty answer counts in ``empty_answers``, not in the TTFT median. Ratios:
``onnx_over_llama_cpp`` (SDK's ONNX backend against raw llama.cpp: decode and TTFT) and each
runtime's SDK overhead, ``1 - sdk/raw`` decode tokens/s. The ONNX folder is prepared first if it
is missing (needs the [export] extra). Both runtimes get the same ``--threads`` (llama.cpp's
n_threads and n_threads_batch, ONNX Runtime's intra-op threads, one inter-op thread).
``onnx_huge_page_mb``: how much of the ONNX backend's loaded model it moved onto 2 MB pages
(llama.cpp reads its mmap'd GGUF through 4 kB pages, its default).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from hybridllm._cli_options import positive_int

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
DEFAULT_MODELS = "smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct"


def _measure(chunks: Iterable[str]) -> tuple[float, float, int]:
    """(TTFT s, decode s, pieces) of a stream of text pieces (about one per token)."""
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
    if first is None or last is None:
        return float("nan"), 0.0, 0
    return first - start, last - first, n


def _summary(rows: list[tuple[float, float, int]]) -> dict:
    decode_s = sum(d for _, d, _ in rows)
    tokens = sum(max(n - 1, 0) for _, _, n in rows)
    # an empty answer has no first token: its NaN TTFT would make the median (and the JSON) NaN
    ttfts = [t for t, _, n in rows if n]
    return {"ttft_ms_p50": round(statistics.median(ttfts) * 1000, 2) if ttfts else None,
            # nothing decoded (one-piece or empty answers): no rate, not 0 tok/s (read as a 100% overhead)
            "decode_tokens_per_s": round(tokens / decode_s, 1) if tokens and decode_s else None,
            "tokens": tokens, "empty_answers": len(rows) - len(ttfts)}


def _sides(
    model: str, backends: list[str], threads: int, max_tokens: int, info: dict
) -> tuple[dict, list]:
    from hybridllm import HybridLLM

    sides: dict[str, Callable[[str], Iterator[str]]] = {}
    closers: list = []
    settings = {"max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0, "seed": 0}

    def sdk_side(backend: str) -> Callable[[str], Iterator[str]]:
        sdk = HybridLLM(edge_model=model, edge_backend=backend, n_ctx=2048, n_threads=threads,
                        cache=False)
        closers.append(sdk)
        return lambda prompt: (c.text for c in sdk.stream(prompt, **settings))

    if "llama_cpp" in backends:
        from llama_cpp import Llama

        from hybridllm.models import resolve_gguf
        from hybridllm.prompts import default_system_prompt

        _, path, _ = resolve_gguf(model)
        raw = Llama(model_path=str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                    n_batch=512, verbose=False)
        closers.append(raw)
        system = default_system_prompt(model)
        prefix = [{"role": "system", "content": system}] if system else []

        def raw_llama(prompt: str) -> Iterator[str]:
            messages: Any = [*prefix, {"role": "user", "content": prompt}]
            out: Any = raw.create_chat_completion(
                messages, stream=True, max_tokens=max_tokens, temperature=0.0, top_p=1.0, seed=0)
            return (c["choices"][0]["delta"].get("content") or "" for c in out)

        sides["raw_llama_cpp"] = raw_llama
        sides["sdk_llama_cpp"] = sdk_side("llama_cpp")
    if "onnx" in backends:
        import onnxruntime_genai as og

        sides["sdk_onnx"] = sdk_side("onnx")
        edge = closers[-1].edge  # the prepared folder, the prompt text and the stop tokens
        # The raw loop runs on the SDK backend's own loaded model (its own generator each call):
        # a second og.Model of the same folder decoded 6% faster than the first one loaded
        # (SmolLM2, same code, load 1.1), which made the overhead a matter of load order.
        og_model, og_tok = edge._model, edge._tok
        info["onnx_huge_page_mb"] = round(edge.huge_page_bytes / 2**20)
        eos = set(edge._eos_ids)

        def raw_onnx(prompt: str) -> Iterator[str]:
            # the prompt ids the SDK feeds (hybridllm.prompts.tokenize_prompt: the template's
            # markers are control tokens, the message is text), so both sides read one prompt
            ids = edge.tokenize([{"role": "user", "content": prompt}])
            params = og.GeneratorParams(og_model)
            params.set_search_options(max_length=len(ids) + max_tokens, do_sample=False)
            gen = og.Generator(og_model, params)
            gen.append_tokens(ids)
            stream = og_tok.create_stream()
            for _ in range(max_tokens):
                gen.generate_next_token()
                token = int(gen.get_next_tokens()[0])
                if token in eos:
                    return
                yield stream.decode(token)

        sides["raw_onnx"] = raw_onnx
    return sides, closers


def run_model(model: str, backends: list[str], rounds: int, max_tokens: int, threads: int) -> dict:
    info: dict = {}
    sides, closers = _sides(model, backends, threads, max_tokens, info)
    names = list(sides)
    results: dict[str, list[tuple[float, float, int]]] = {n: [] for n in names}
    for name in names:  # warm-up: load, fill caches
        _measure(sides[name](PROMPTS[0]))
    for r in range(rounds):
        for i, prompt in enumerate(PROMPTS):
            shift = (i + r) % len(names)
            for name in names[shift:] + names[:shift]:
                results[name].append(_measure(sides[name](prompt)))
    for c in closers:
        c.close()
    out: dict = {"model": model, **{n: _summary(rows) for n, rows in results.items()}, **info}

    def ratio(a: str, b: str, key: str) -> float | None:
        # a side without the figure (None: nothing measured) has no ratio, nor a zero divisor
        if a not in out or b not in out or out[a][key] is None or not out[b][key]:
            return None
        return round(float(out[a][key]) / float(out[b][key]), 3)

    out["onnx_over_llama_cpp"] = {
        "decode_tps_ratio": ratio("sdk_onnx", "raw_llama_cpp", "decode_tokens_per_s"),
        "ttft_ratio": ratio("sdk_onnx", "raw_llama_cpp", "ttft_ms_p50")}
    for rt in ("llama_cpp", "onnx"):
        rel = ratio(f"sdk_{rt}", f"raw_{rt}", "decode_tokens_per_s")
        out[f"sdk_overhead_{rt}"] = None if rel is None else round(1 - rel, 3)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object only")
    ap.add_argument("--models", default=DEFAULT_MODELS,
                    help=f"catalog ids, comma-separated (default {DEFAULT_MODELS})")
    ap.add_argument("--backends", default="llama_cpp,onnx",
                    help="SDK backends to measure, comma-separated (default llama_cpp,onnx)")
    ap.add_argument("--rounds", type=positive_int, default=2,
                    help="rounds over the prompts, sides rotating (default 2)")
    ap.add_argument("--max-tokens", type=positive_int, default=64, help="tokens per answer (default 64)")
    ap.add_argument("--threads", type=positive_int, default=None,
                    help="CPU threads for every side (default: all cores; 1 is fairer on a busy machine)")
    args = ap.parse_args(argv)
    threads = args.threads or os.cpu_count() or 1
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or set(backends) - {"llama_cpp", "onnx"}:  # no side at all measured nothing
        ap.error(f"--backends: a comma-separated list of llama_cpp, onnx (got {args.backends!r})")
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    if not names:
        ap.error(f"--models: catalog ids, comma-separated (got {args.models!r})")
    from hybridllm._exceptions import ModelNotFoundError
    from hybridllm.models import get_spec

    for name in names:  # an unknown id: one line now, not a traceback after the others ran
        if os.path.isfile(name):  # a .gguf path, as resolve_gguf takes it
            continue
        try:
            get_spec(name)
        except ModelNotFoundError as exc:
            ap.error(f"--models: {exc}")
    models = [run_model(m, backends, args.rounds, args.max_tokens, threads) for m in names]
    result = {"bench": "edge", "threads": threads, "load_avg_1m": round(os.getloadavg()[0], 2),
              "prompts": len(PROMPTS), "rounds": args.rounds,
              "max_tokens": args.max_tokens, "onnx_precision": "int4", "models": models}
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
