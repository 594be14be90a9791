"""Train the hit verifier on labelled question pairs and write ``models/cache_verifier.npz``.

    python -m hybridllm.cache.train --data ../shared/data/paraphrase/qqp_pairs.jsonl --out models/

Pairs are split 70/15/15 into train / validation / test by connected component of the question
graph (two pairs that share a question land in the same split), so no test question is seen in
training. The MLP is trained on train (both orders of each pair), the operating threshold is the
lowest one whose validation precision reaches ``--target-precision`` (0.95 plus a margin), and
precision / recall / false-hit rate are then reported on the untouched test split, using the
cache's own protocol (``text_a`` is cached, ``text_b`` is the query).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .._exceptions import DataError
from .._paths import cache_dir
from .evaluate import PairSet, load_pairs, pair_metrics
from .features import pair_features
from .verifier import DEFAULT_NAME, HitVerifier

SPLITS = ("train", "val", "test")


def split_of_pairs(pairs: PairSet, *, seed: int = 0) -> np.ndarray:
    """0/1/2 (train/val/test) per pair, one split per connected component of shared questions."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in zip(pairs.text_a, pairs.text_b, strict=True):
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb
    out = np.empty(len(pairs), dtype=np.int8)
    for i, a in enumerate(pairs.text_a):
        bucket = zlib.crc32(f"{seed}:{find(a)}".encode()) % 100
        out[i] = 0 if bucket < 70 else (1 if bucket < 85 else 2)
    return out


def embed_texts(
    texts: list[str], *, cache_file: Path | None = None, say: Callable[[str], None] = print
) -> dict[str, np.ndarray]:
    """Unit vectors for ``texts``, one call per text as the cache embeds at run time."""
    if cache_file is not None and cache_file.is_file():
        with np.load(cache_file, allow_pickle=False) as data:
            known = dict(zip(data["texts"].tolist(), data["vecs"], strict=True))
        if all(t in known for t in texts):
            say(f"embeddings from {cache_file}")
            return known
    from .embedder import get_embedder

    embedder = get_embedder()
    vecs = np.empty((len(texts), embedder.dim), dtype=np.float32)
    start = time.perf_counter()
    for i, text in enumerate(texts):
        vecs[i] = embedder.embed_one(text)
        if i % 10000 == 0 and i:
            say(f"embedded {i}/{len(texts)} in {time.perf_counter() - start:.0f}s")
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(cache_file.name + ".tmp.npz")
        np.savez(tmp, texts=np.array(texts, dtype=str), vecs=vecs)
        tmp.replace(cache_file)
    return dict(zip(texts, vecs, strict=True))


def featurize(pairs: PairSet, vecs: dict[str, np.ndarray], idx: np.ndarray, *, swap: bool = False):
    a = [pairs.text_a[i] for i in idx]
    b = [pairs.text_b[i] for i in idx]
    if swap:
        a, b = b, a
    va = np.stack([vecs[t] for t in a])
    vb = np.stack([vecs[t] for t in b])
    return pair_features(b, a, vb, va), np.einsum("nd,nd->n", va, vb)  # query b, cached a


def choose_threshold(
    probs: np.ndarray, sims: np.ndarray, labels: np.ndarray, *, min_similarity: float, target: float
) -> float:
    """The lowest threshold whose precision on these pairs is at least ``target``."""
    eligible = sims >= min_similarity
    order = np.argsort(-probs[eligible])
    sorted_probs = probs[eligible][order]
    correct = np.cumsum(labels[eligible][order])
    precision = correct / np.arange(1, len(order) + 1)
    # walk from the most confident hit down; keep the last point where precision holds,
    # after at least 50 hits so a handful of lucky pairs does not set it
    ok = np.nonzero((precision >= target) & (np.arange(1, len(order) + 1) >= 50))[0]
    if len(ok) == 0:
        return 1.0
    return float(sorted_probs[ok[-1]])


def train(
    data: Path,
    out_dir: Path,
    *,
    hidden: int = 256,
    target_precision: float = 0.97,
    min_similarity: float = 0.5,
    seed: int = 0,
    say: Callable[[str], None] = print,
) -> dict[str, float]:
    from sklearn.neural_network import MLPClassifier

    pairs = load_pairs(data)
    split = split_of_pairs(pairs, seed=seed)
    texts = sorted(set(pairs.text_a) | set(pairs.text_b))
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    vecs = embed_texts(texts, cache_file=cache_dir() / "train" / f"qqp-{digest}.npz", say=say)
    labels = np.asarray(pairs.labels, dtype=np.int8)
    tr, va, te = (np.nonzero(split == s)[0] for s in range(3))
    say(f"pairs: train {len(tr)}, val {len(va)}, test {len(te)}")

    x_fwd, _ = featurize(pairs, vecs, tr)
    x_rev, _ = featurize(pairs, vecs, tr, swap=True)
    x_train = np.concatenate([x_fwd, x_rev])
    y_train = np.concatenate([labels[tr], labels[tr]])
    mean = x_train.mean(0)
    scale = x_train.std(0) + 1e-6
    say(f"training MLP({hidden}) on {len(x_train)} pairs x {x_train.shape[1]} features")
    mlp = MLPClassifier(
        hidden_layer_sizes=(hidden,),
        alpha=1e-2,
        batch_size=256,
        learning_rate_init=1e-3,
        max_iter=60,
        early_stopping=True,
        validation_fraction=0.1,
        n_iter_no_change=6,
        random_state=seed,
    )
    mlp.fit((x_train - mean) / scale, y_train)
    verifier = HitVerifier(
        list(zip(mlp.coefs_, mlp.intercepts_, strict=True)),
        mean=mean,
        scale=scale,
        threshold=0.5,
        min_similarity=min_similarity,
    )
    x_val, sims_val = featurize(pairs, vecs, va)
    verifier.threshold = choose_threshold(
        verifier.predict_features(x_val),
        sims_val,
        labels[va],
        min_similarity=min_similarity,
        target=target_precision,
    )
    x_test, sims_test = featurize(pairs, vecs, te)
    hits = verifier.accept(verifier.predict_features(x_test), sims_test)
    metrics = {f"test_{k}": v for k, v in pair_metrics(hits, labels[te]).items()}
    val_hits = verifier.accept(verifier.predict_features(x_val), sims_val)
    metrics.update({f"val_{k}": v for k, v in pair_metrics(val_hits, labels[va]).items()})
    metrics.update(threshold=verifier.threshold, seed=seed)
    verifier.metrics = metrics
    out_dir.mkdir(parents=True, exist_ok=True)
    verifier.save(out_dir / DEFAULT_NAME)
    say(f"wrote {out_dir / DEFAULT_NAME}")
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridllm.cache.train", description=__doc__)
    parser.add_argument("--data", type=Path, required=True, help="JSONL: text_a, text_b, label")
    parser.add_argument("--out", type=Path, default=Path("models"))
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--target-precision", type=float, default=0.97)
    parser.add_argument("--min-similarity", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731 - the JSON goes to stdout
    try:
        metrics = train(
            args.data,
            args.out,
            hidden=args.hidden,
            target_precision=args.target_precision,
            min_similarity=args.min_similarity,
            seed=args.seed,
            say=say,
        )
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
