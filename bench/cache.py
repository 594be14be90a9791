"""The semantic cache on the device: embedding, lookup, and a hit against generating an answer.

    python -m bench.cache [--json] [--max-tokens 64] [--sizes 10000,100000]
        [--parts embed,lookup,hits,verified,generate] [--verified-size 10000] [--verified-queries 400]

- ``embed_p50_ms`` / ``embed_p99_ms``: one question through the int8 ONNX embedder.
- ``lookup_{n}_p50_ms`` / ``_p99_ms``: index search in one bucket of ``n`` cached vectors,
  embedding excluded (real MiniLM vectors of QQP questions when the training run cached them);
  past 20k vectors the index is two-stage, and ``lookup_{n}_top1_agreement`` is how often it
  returns the same best match as exact search.
- ``hit_exact_ms`` / ``hit_paraphrase_ms``: :meth:`SemanticCache.get` end to end (SQLite,
  embedder, index, verifier) for a repeated and for a reworded question, median, with the default
  verifier (the cross-encoder reranker); ``hit_paraphrase_features_ms`` with ``verifier="features"``.
  ``verify{,_features}_ms``: the verifier's part of that paraphrase lookup (median), and
  ``verify{,_features}_share`` its fraction of the lookup: what a lighter verifier could save.
- ``verified_{n}_*``: :meth:`SemanticCache.get` end to end at ``n`` cached QQP questions in one
  bucket (``--verified-size``), asked the other question of held-out (test split) QQP pairs, each
  lookup timed both with the default verifier, which runs the reranker graph on one pair at a time
  (a pair's score depends on that pair alone, as when ``hybridllm cache eval`` scores it), and with
  all candidates in one batch (``_batched``, the default before 2026-11-27: the int8 graph's
  activation scale then comes from every candidate), interleaved query by query (which goes first
  alternates); both skip what the logit range rules out (``at_least``). ``miss``/``hit``: p50 and
  p95 by what the default lookup returned; ``_batched_over_pair`` the ratios;
  ``decisions_changed``: lookups whose served entry (or miss) differs between the two;
  ``precision``/``recall``: a hit is correct when it serves the pair's own question and the pair
  is labelled a duplicate; ``graph_skipped``: the share of lookups with candidates that ran no
  graph; ``pairs_scored{,_batched}``: the share of candidates that went through the graph. The
  cached questions' vectors are computed once (one question at a time, as at run time) and kept
  under ``cache_dir()/bench/``.
- ``generate_ms``: the edge model (SmolLM2-135M in llama-cpp-python, called directly) writing
  ``max_tokens`` tokens for the same question, median; the ratios compare it with the hits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench._cache_calls import _count_calls, _time_calls
from bench._cache_inputs import HIT_PAIRS, PAIRS, _corpus, _questions, _verified_set
from hybridllm._cli_options import positive_int


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q))


def bench_embed(embedder, questions: list[str]) -> dict:
    for q in questions[:20]:
        embedder.embed_one(q)
    times = []
    for q in questions:
        start = time.perf_counter()
        embedder.embed_one(q)
        times.append(time.perf_counter() - start)
    return {"embed_p50_ms": _pct(times, 50), "embed_p99_ms": _pct(times, 99)}


def bench_lookup(embedder, sizes: list[int], queries: np.ndarray) -> dict:
    from hybridllm.cache.index import FlatIndex

    out: dict = {}
    for n in sizes:
        corpus = _corpus(embedder, n)
        index = FlatIndex(embedder.dim, capacity=n)
        for i in range(n):
            index.add(str(i), corpus[i])
        for q in queries[:10]:
            index.search(q, 5)
        times = []
        for q in queries:
            start = time.perf_counter()
            index.search(q, 5)
            times.append(time.perf_counter() - start)
        out[f"lookup_{n}_p50_ms"] = _pct(times, 50)
        out[f"lookup_{n}_p99_ms"] = _pct(times, 99)
        out[f"lookup_{n}_exact"] = index.is_exact
        if not index.is_exact:  # how often the two-stage search returns the exact best match
            found = 0
            for q in queries:
                best = str(int(np.argmax(corpus @ q)))
                found += index.search(q, 1)[0][0] == best
            out[f"lookup_{n}_top1_agreement"] = found / len(queries)
    return out


def bench_hits(embedder, rounds: int) -> dict:
    """Hits end to end with the default verifier (the reranker) and with ``verifier="features"``."""
    from hybridllm.cache import SemanticCache

    kw: dict[str, Any] = {"model": "smollm2-135m-instruct", "params_key": {"temperature": 0}}
    out: dict[str, Any] = {}
    for verifier, suffix in (("default", ""), ("features", "_features")):
        exact, para, verify, accepted = [], [], [], 0
        with tempfile.TemporaryDirectory() as tmp:
            cache = SemanticCache(Path(tmp) / "bench.sqlite3", embedder=embedder, verifier=verifier)
            for cached, _ in HIT_PAIRS:
                cache.put([{"role": "user", "content": cached}], "an answer " * 40, **kw)
            spent = _time_calls(cache.verifier, "predict")
            try:
                for _ in range(rounds):
                    for cached, asked in HIT_PAIRS:
                        start = time.perf_counter()
                        cache.get([{"role": "user", "content": cached}], **kw)
                        exact.append(time.perf_counter() - start)
                        spent.clear()
                        start = time.perf_counter()
                        hit = cache.get([{"role": "user", "content": asked}], **kw)
                        para.append(time.perf_counter() - start)
                        verify.append(sum(spent))
                        accepted += hit is not None
            finally:
                delattr(cache.verifier, "predict")  # the shared verifier's own method again
            cache.close()
        if not suffix:
            out["hit_exact_ms"] = _pct(exact, 50)
        out[f"hit_paraphrase{suffix}_ms"] = _pct(para, 50)
        out[f"verify{suffix}_ms"] = _pct(verify, 50)
        # per lookup, then the median: the verifier's fraction of the lookup it ran in
        out[f"verify{suffix}_share"] = float(np.median(np.asarray(verify) / np.asarray(para)))
        out[f"paraphrase_hits{suffix}"] = f"{accepted}/{len(para)}"
    return out


def bench_verified(embedder, n: int, num_queries: int, rounds: int) -> dict:
    """The default verifier's lookups at ``n`` entries, one pair per graph run and all candidates in
    one batch (``_batched``), interleaved lookup by lookup (which goes first alternates), on one
    cache."""
    import hashlib

    from hybridllm._paths import cache_dir
    from hybridllm.cache import RerankVerifier, SemanticCache
    from hybridllm.cache.train import embed_texts

    questions, asked = _verified_set(n, num_queries)
    digest = hashlib.sha256("\n".join(questions).encode()).hexdigest()[:16]
    cache_file = cache_dir() / "bench" / f"qqp-{digest}.npz"
    vecs = embed_texts(questions, cache_file=cache_file, say=lambda _line: None)
    kw: dict[str, Any] = {"model": "smollm2-135m-instruct", "params_key": {"temperature": 0}}
    modes = {"": 1, "_batched": 64}  # suffix -> pairs per graph run
    times: dict[str, list[float]] = {m: [] for m in modes}
    verify: dict[str, list[float]] = {m: [] for m in modes}
    served: dict[str, list[str | None]] = {m: [] for m in modes}
    scored: dict[str, list[int]] = {m: [] for m in modes}  # per lookup verified: pairs run
    candidates: list[int] = []  # per lookup verified: pairs the verifier was given
    skipped: list[bool] = []  # per lookup verified: the graph did not run
    with tempfile.TemporaryDirectory() as tmp:
        cache = SemanticCache(Path(tmp) / "bench.sqlite3", embedder=embedder, ttl_s=None, max_entries=n + 1)
        for question in questions:
            cache.put([{"role": "user", "content": question}], "an answer", embedding=vecs[question], **kw)
        verifier = cache.verifier
        assert isinstance(verifier, RerankVerifier), "the default verifier is the reranker"
        spent = _time_calls(verifier, "predict")
        given = _count_calls(verifier, "predict", lambda args: len(args[0]))
        runs = _count_calls(verifier.reranker, "run_batches", lambda args: sum(len(i) for i, _ in args[0]))
        for q, _, _ in asked[:10]:  # warm up
            cache.get([{"role": "user", "content": q}], **kw)
        try:
            for r in range(rounds):
                for j, (q, _, _) in enumerate(asked):
                    for mode in list(modes) if (r + j) % 2 == 0 else list(modes)[::-1]:
                        verifier.batch_size = modes[mode]
                        spent.clear()
                        given.clear()
                        runs.clear()
                        start = time.perf_counter()
                        hit = cache.get([{"role": "user", "content": q}], **kw)
                        times[mode].append(time.perf_counter() - start)
                        verify[mode].append(sum(spent))
                        if r == 0:
                            served[mode].append(hit.cached_query if hit else None)
                            if given:
                                scored[mode].append(sum(runs))
                                if mode == "":
                                    candidates.append(sum(given))
                                    skipped.append(not runs)
        finally:
            verifier.batch_size = modes[""]
            delattr(verifier, "predict")
            delattr(verifier.reranker, "run_batches")
            cache.close()
    out: dict[str, Any] = {}
    is_hit = np.array([s is not None for s in served[""]] * rounds)
    positives = sum(label for _, _, label in asked)
    for mode in modes:
        t = np.asarray(times[mode])
        for kind, mask in (("miss", ~is_hit), ("hit", is_hit)):
            if mask.any():
                out[f"verified_{n}_{kind}{mode}_p50_ms"] = _pct(list(t[mask]), 50)
                out[f"verified_{n}_{kind}{mode}_p95_ms"] = _pct(list(t[mask]), 95)
        out[f"verified_{n}_verify{mode}_ms"] = _pct(verify[mode], 50)
        num_hits = sum(s is not None for s in served[mode])
        # correct: the pair's own question served, for a pair labelled a duplicate
        right = sum(s == a and bool(label) for s, (_, a, label) in zip(served[mode], asked, strict=True))
        out[f"verified_{n}_hits{mode}"] = f"{num_hits}/{len(asked)}"
        # null where there is nothing to divide by: no hit served, no duplicate pair asked, no
        # candidate verified (a made-up precision 1.0, recall 0.0 or 0% scored before)
        out[f"verified_{n}_precision{mode}"] = right / num_hits if num_hits else None
        out[f"verified_{n}_recall{mode}"] = right / positives if positives else None
        out[f"verified_{n}_pairs_scored{mode}"] = (
            sum(scored[mode]) / sum(candidates) if sum(candidates) else None)
    for kind in ("miss", "hit"):
        for q in ("p50", "p95"):
            pair = out.get(f"verified_{n}_{kind}_{q}_ms")
            if pair:
                batched = out[f"verified_{n}_{kind}_batched_{q}_ms"]
                out[f"verified_{n}_{kind}_{q}_batched_over_pair"] = batched / pair
    out[f"verified_{n}_decisions_changed"] = sum(a != b for a, b in zip(*served.values(), strict=True))
    out[f"verified_{n}_graph_skipped"] = float(np.mean(skipped)) if skipped else None
    return out


def bench_generate(max_tokens: int, rounds: int) -> dict:
    from llama_cpp import Llama

    from hybridllm.models import pull

    llm = Llama(model_path=str(pull("smollm2-135m-instruct")), n_ctx=2048, verbose=False)
    times, tokens = [], []
    for _ in range(rounds):
        for _, asked in HIT_PAIRS:
            start = time.perf_counter()
            out: Any = llm.create_chat_completion(
                [{"role": "user", "content": asked}],
                max_tokens=max_tokens,
                temperature=0.0,
            )
            times.append(time.perf_counter() - start)
            tokens.append(out["usage"]["completion_tokens"])
    return {"generate_ms": _pct(times, 50), "generate_tokens": int(np.median(tokens))}


PARTS = ("embed", "lookup", "hits", "verified", "generate")


def run(
    *,
    sizes: list[int],
    max_tokens: int,
    rounds: int,
    verified_size: int = 10000,
    verified_queries: int = 400,
    parts: tuple[str, ...] = PARTS,
) -> dict:
    from hybridllm.cache import get_embedder

    embedder = get_embedder()
    questions = _questions(300)
    result: dict = {"cpu_count": os.cpu_count()}
    if "embed" in parts:
        result.update(bench_embed(embedder, questions))
    if "lookup" in parts:
        queries = np.stack([embedder.embed_one(q) for q in questions[:200]])
        result.update(bench_lookup(embedder, sizes, queries))
    if "hits" in parts:
        result.update(bench_hits(embedder, rounds))
    if "verified" in parts and PAIRS.is_file():
        result.update(bench_verified(embedder, verified_size, verified_queries, rounds))
    elif "verified" in parts:  # said, not a run that silently leaves the part out
        print(f"bench.cache: verified_* left out: {PAIRS} is missing (the QQP pairs of ../shared/data, "
              "beside this checkout)", file=sys.stderr)
    if "generate" in parts:
        result.update(bench_generate(max_tokens, rounds))
        if "hits" in parts:
            result["generate_over_hit_exact"] = result["generate_ms"] / result["hit_exact_ms"]
            result["generate_over_hit_paraphrase"] = result["generate_ms"] / result["hit_paraphrase_ms"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cache", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--max-tokens", type=positive_int, default=64,
                        help="tokens generated for the comparison (default 64)")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="timed rounds of each part (default 3)")
    parser.add_argument("--sizes", default="10000,100000",
                        help="cache sizes for the lookup timing, comma-separated (default 10000,100000)")
    parser.add_argument("--verified-size", type=positive_int, default=10000, help="entries for verified_*")
    parser.add_argument("--verified-queries", type=positive_int, default=400, help="lookups for verified_*")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which to run, of {','.join(PARTS)}")
    args = parser.parse_args(argv)
    try:  # a bad size: one line now, not a traceback (or an empty index) after the embedder loads
        sizes = [positive_int(s) for s in args.sizes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as exc:
        parser.error(f"--sizes: {exc}")
    if "lookup" in args.parts.split(",") and not sizes:
        parser.error(f"--sizes: cache sizes, comma-separated (got {args.sizes!r})")
    parts = tuple(p for p in args.parts.split(",") if p)
    if unknown := sorted(set(parts) - set(PARTS)):
        parser.error(f"unknown --parts {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    result = run(
        sizes=sizes,
        max_tokens=args.max_tokens,
        rounds=args.rounds,
        verified_size=args.verified_size,
        verified_queries=args.verified_queries,
        parts=parts,
    )
    if args.json:
        print(json.dumps(result))
    else:
        width = max(map(len, result))
        for key, value in result.items():
            shown = f"{value:.3f}" if isinstance(value, float) else value
            print(f"{key:<{width}}  {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
