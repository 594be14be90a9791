"""`hybridllm cache stats | clear | eval` and the embedder step of `hybridllm models prepare`."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def prepare_embedder(progress: Callable[[int, int | None], None] | None = None) -> Path:
    """Build and quantize MiniLM and the cache reranker into the data dir (each says so in one line
    on stderr the first time, which is all the progress shown: ``progress`` is not drawn); a no-op
    when already done. Prints both folders; returns the embedder's."""
    from .prepare import prepare_embedder as _prepare_embedder
    from .prepare import prepare_reranker
    from .reranker_file import read_info

    out = _prepare_embedder()
    info = read_info()
    reranker = prepare_reranker(info.path, info.weights_digest)
    print(f"embedder: {out}\ncache reranker: {reranker}")
    return out


def _open(args: argparse.Namespace) -> Any:
    from .._exceptions import CacheError
    from .semantic import SemanticCache

    if args.path is not None and not args.path.is_file():  # a typo must not make a new, empty cache
        raise CacheError(f"There is no cache database at {args.path}.")
    # stats/clear never embed or verify: no model load for them
    return SemanticCache(args.path, verifier=None)


def cmd_stats(args: argparse.Namespace) -> int:
    with _open(args) as cache:
        stats = cache.stats()
    if args.json:
        print(json.dumps(stats))
        return 0
    print(f"path:        {stats['path']}")
    print(f"entries:     {stats['entries']} (max {stats['max_entries']})")
    print(f"size:        {stats['size_bytes'] / 1e6:.1f} MB")
    print(f"ttl:         {stats['ttl_s']} s")
    for ns, n in stats["namespaces"].items():
        print(f"  {ns:<24}{n}")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    with _open(args) as cache:
        removed = cache.clear(args.namespace)
    where = f"namespace {args.namespace!r}" if args.namespace else "all namespaces"
    print(f"removed {removed} entries from {where}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from .._progress import ProgressBar
    from .evaluate import evaluate_pairs, load_pairs

    pairs = load_pairs(args.pairs, limit=args.limit)
    bar = ProgressBar("Evaluating pairs", unit="pairs", scale=1)
    metrics = evaluate_pairs(pairs, verifier=args.verifier, progress=bar)
    if args.json:
        print(json.dumps(metrics))
    else:
        print(
            f"n={metrics['n']}  precision={metrics['precision']:.3f}  "
            f"recall={metrics['recall']:.3f}  false_hit_rate={metrics['false_hit_rate']:.3f}"
        )
    return 0


def register(subparsers: Any) -> None:
    cache = subparsers.add_parser("cache", help="inspect, clear and evaluate the semantic cache")
    sub = cache.add_subparsers(dest="cache_command", metavar="ACTION", required=True)

    p = sub.add_parser("stats", help="entries, namespaces and size of the cache")
    p.add_argument("--path", type=Path, default=None, help="cache database (default: user cache)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("clear", help="delete cached answers")
    p.add_argument("--path", type=Path, default=None, help="cache database (default: user cache)")
    p.add_argument("--namespace", default=None, help="only this namespace (default: all)")
    p.set_defaults(func=cmd_clear)

    p = sub.add_parser(
        "eval",
        help="precision/recall on labelled pairs (caches text_a, asks text_b)",
    )
    p.add_argument("--pairs", type=Path, required=True, help="JSONL: text_a, text_b, label")
    p.add_argument("--limit", type=int, default=None, help="only the first N pairs")
    p.add_argument(
        "--verifier",
        default="default",
        help="default (the shipped reranker), features, cosine, or a verifier .npz file",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_eval)
