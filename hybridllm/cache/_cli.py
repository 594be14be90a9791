"""`hybridllm cache stats | clear | eval` and the embedder step of `hybridllm models prepare`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._cli_options import positive_int
from .._finite import finite_json


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


def _settings(args: argparse.Namespace) -> tuple[Path, Any]:
    """The cache file these commands act on and the settings the client would use with it:
    ``--path``, else ``cache_path`` from the environment or config file (as ``HybridLLM`` reads
    it), else the default file in the user cache dir."""
    from .._config import load_config
    from .._exceptions import CacheError
    from .._paths import cache_dir, setting_path
    from .semantic import DEFAULT_FILENAME

    cfg = load_config()
    if args.path is not None:
        path = args.path.expanduser()  # a quoted "~/c.sqlite3", as cache_path is read
    else:  # cache_path read as SemanticCache reads it (a blank one is no path)
        path = setting_path(cfg.cache_path, "cache_path") or cache_dir() / DEFAULT_FILENAME
    if path.is_dir():
        raise CacheError(f"{path} is a folder; pass the path of a cache database file.")
    if args.path is not None and not path.is_file():  # a typo must not make a new, empty cache
        raise CacheError(f"There is no cache database at {path}.")
    return path, cfg


def _holds_cache(path: Path) -> bool:
    """Whether ``path`` holds a database to open: False when it is missing or empty (its WAL
    too: a new cache's first commit may be in the WAL only), so nothing is created there; an
    error for a file that is not an SQLite database (a mistyped path: notes, a model file).
    Before, such a file was moved aside to ``.corrupt-*`` as a corrupt cache and an empty cache
    made in its place, even by ``stats``. An SQLite file that is a damaged cache is still
    rebuilt, as the client would."""
    from .._exceptions import CacheError

    wal = Path(f"{path}-wal")
    try:
        if not path.exists():
            return False
        with open(path, "rb") as f:
            head = f.read(16)
        if not head:
            return wal.exists() and wal.stat().st_size > 0
    except OSError as exc:
        raise CacheError(f"Cannot read the cache database {path} ({exc.strerror or exc}).") from exc
    if head != b"SQLite format 3\x00":
        raise CacheError(
            f"{path} is not a cache database (not an SQLite file); it was left untouched. "
            "Pass the path of a hybridllm cache (or delete the file, if it was a damaged one)."
        )
    return True


def _verifier_info(spec: str) -> tuple[str, float | None, float | None]:
    """(kind, threshold, min_similarity) of the configured verifier, read from its file: no
    model is loaded. A verifier that cannot be read is reported, not fatal, for stats."""
    from .._exceptions import HybridLLMError
    from .semantic import COSINE_ONLY_MIN_SIMILARITY, load_verifier

    try:
        verifier = load_verifier(spec)
    except HybridLLMError as exc:
        return f"{spec} (unreadable: {exc})", None, None
    if verifier is None:
        return "cosine", None, COSINE_ONLY_MIN_SIMILARITY
    return verifier.kind, verifier.threshold, verifier.min_similarity


def _open_store(path: Path) -> Any:
    """The store of ``path``, of whatever dimension the file holds (nothing is embedded). A
    corrupt file is moved aside and rebuilt, as the client would; that is said in one line on
    stderr, not as a Python warning with our source line under it."""
    import sys
    import warnings

    from .store import CacheStore

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        store = CacheStore(path, dim=None)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    return store


def _stats(path: Path, cfg: Any) -> dict:
    import time

    verifier, threshold, min_similarity = _verifier_info(cfg.cache_verifier)
    stats: dict[str, Any] = {"path": str(path), "entries": 0, "expired": 0, "namespaces": {},
                             "size_bytes": 0, "total_hits": 0, "total_misses": 0, "damaged_entries": 0}
    if _holds_cache(path):
        store = _open_store(path)
        try:
            ttl = cfg.cache_ttl_s
            stats["namespaces"] = store.namespaces(not_before=time.time() - ttl if ttl else None)
            stats["entries"] = sum(stats["namespaces"].values())
            stats["expired"] = store.count() - stats["entries"]
            stats["total_hits"], stats["total_misses"] = store.lookup_counts()
            stats["damaged_entries"] = store.damaged_count()
        finally:
            store.close()
        stats["size_bytes"] = sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    lookups = stats["total_hits"] + stats["total_misses"]
    stats.update({
        "total_hit_rate": stats["total_hits"] / lookups if lookups else 0.0,
        "max_entries": cfg.cache_max_entries,
        "ttl_s": cfg.cache_ttl_s,
        "verifier": verifier,
        "threshold": threshold,
        "min_similarity": min_similarity,
    })
    return stats


def cmd_stats(args: argparse.Namespace) -> int:
    path, cfg = _settings(args)
    stats = _stats(path, cfg)
    if args.json:
        print(finite_json(stats))  # ttl_s may be inf (no bound): null, as config show has it
        return 0
    if not path.exists():
        print(f"no cache database at {path} yet: nothing has been cached")
    print(f"path:        {stats['path']}")
    expired = f", {stats['expired']} expired" if stats.get("expired") else ""
    print(f"entries:     {stats['entries']} (max {stats['max_entries']}{expired})")
    size = stats["size_bytes"]
    print(f"size:        {size / 1e6:.1f} MB" if size >= 1e6 else f"size:        {size / 1e3:.0f} kB")
    print(f"ttl:         {stats['ttl_s']} s" if stats["ttl_s"] else "ttl:         none")
    print(f"lookups:     {stats['total_hits']} hits, {stats['total_misses']} misses "
          f"(hit rate {stats['total_hit_rate']:.1%})")
    damaged = stats["damaged_entries"]
    print(f"damaged:     {damaged} entr{'y' if damaged == 1 else 'ies'} found damaged and removed"
          if damaged else "damaged:     none found")
    threshold = "" if stats["threshold"] is None else f", threshold {stats['threshold']:.3f}"
    similarity = "" if stats["min_similarity"] is None else f", min similarity {stats['min_similarity']:.2f}"
    print(f"verifier:    {stats['verifier']}{threshold}{similarity}")
    names = {ns: _shown(ns) for ns in stats["namespaces"]}
    # at least two spaces after the longest name: a name of 24 characters or more (a tenant's
    # UUID) ran into its count, "...4466554400003" for 3 entries of "...446655440000"
    width = max([24] + [len(name) + 2 for name in names.values()])
    for ns, n in stats["namespaces"].items():
        print(f"  {names[ns]:<{width}}{n}")
    return 0


def _shown(namespace: str) -> str:
    """A namespace as one line shows it: quoted, with escapes, when it holds a line break or
    another character that prints as none (a tenant id read with its newline)."""
    return namespace if namespace.isprintable() else repr(namespace)


def cmd_clear(args: argparse.Namespace) -> int:
    from .._exceptions import CacheError
    from .._message_text import LONE_SURROGATE

    if args.namespace is not None and not args.namespace:
        raise CacheError("--namespace must not be empty; leave it out to clear every namespace.")
    if args.namespace is not None and LONE_SURROGATE.search(args.namespace):
        # bytes that are not UTF-8 in argv (Python keeps them as lone surrogates): no namespace is
        # named so, and SQLite cannot take them (an "internal error" before)
        raise CacheError(f"--namespace {args.namespace!r} is not valid UTF-8 text; no namespace is named so.")
    path, _ = _settings(args)
    if not _holds_cache(path):
        print(f"no cache database at {path}: nothing to clear")
        return 0
    store = _open_store(path)
    try:
        known = store.namespaces()
        removed = len(store.clear(args.namespace))
    finally:
        store.close()
    entries = f"{removed} entr{'y' if removed == 1 else 'ies'}"
    if args.namespace is None:
        print(f"removed {entries} from all namespaces of {path}")
    elif args.namespace in known:
        print(f"removed {entries} from namespace {args.namespace!r} of {path}")
    else:
        have = ", ".join(repr(n) for n in known) or "none"
        print(f"removed nothing: {path} has no namespace {args.namespace!r} (it has: {have})")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from .._progress import ProgressBar
    from .evaluate import evaluate_pairs, load_pairs

    pairs = load_pairs(args.pairs, limit=args.limit)
    bar = ProgressBar("Evaluating pairs", unit="pairs", scale=1)
    metrics = evaluate_pairs(pairs, verifier=args.verifier, progress=bar)
    if args.json:
        print(finite_json(metrics))
    else:
        rates = "  ".join(f"{k}={_rate(metrics[k])}" for k in ("precision", "recall", "false_hit_rate"))
        print(f"n={metrics['n']}  {rates}")
        for key, why in (("precision", "no pair was a hit"), ("recall", "no pair is labelled 1"),
                         ("false_hit_rate", "no pair is labelled 0")):
            if metrics[key] is None:
                print(f"{key} is undefined: {why}")
    return 0


def _rate(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3f}"


def register(subparsers: Any) -> None:
    cache = subparsers.add_parser("cache", help="inspect, clear and evaluate the semantic cache")
    sub = cache.add_subparsers(dest="cache_command", metavar="ACTION", required=True)

    default = "cache_path from the config, else the user cache dir"
    p = sub.add_parser("stats", help="entries, namespaces, size, lookups and verifier of the cache")
    p.add_argument("--path", type=Path, default=None, help=f"cache database (default: {default})")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("clear", help="delete cached answers")
    p.add_argument("--path", type=Path, default=None, help=f"cache database (default: {default})")
    p.add_argument("--namespace", default=None, help="only this namespace (default: all)")
    p.set_defaults(func=cmd_clear)

    p = sub.add_parser(
        "eval",
        help="precision/recall on labelled pairs (caches text_a, asks text_b)",
    )
    p.add_argument("--pairs", type=Path, required=True, help="JSONL: text_a, text_b, label")
    p.add_argument("--limit", type=positive_int, default=None, help="only the first N pairs (default: all)")
    p.add_argument(
        "--verifier",
        default="default",
        help="default (the shipped reranker; the default), features, cosine, or a verifier .npz file",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_eval)
