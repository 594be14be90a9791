"""Train the hit verifier on labelled question pairs and write ``hybridllm/_data/cache_verifier.npz``.

    python -m hybridllm.cache.train --data ../shared/data/paraphrase/qqp_pairs.jsonl --out hybridllm/_data/

Pairs are split 70/15/15 into train / validation / test by connected component of the question
graph (two pairs that share a question land in the same split), so no test question is seen in
training. The verifier (a logistic stage over all pair features feeding boosted trees over the
surface features, see :mod:`.verifier`) is trained on train (both orders of each pair), the
operating threshold is the
lowest one whose validation precision reaches ``--target-precision`` (0.95), and
precision / recall / false-hit rate are then reported on the untouched test split, using the
cache's own protocol (``text_a`` is cached, ``text_b`` is the query).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import DataError, HybridLLMError
from .._files import DAMAGED_NPZ_ERRORS
from .._paths import cache_dir
from .evaluate import PairSet, load_pairs, pair_metrics
from .features import NUM_HANDCRAFTED, Idf, pair_features
from .verifier import _TREE_FIELDS, DEFAULT_NAME, FORMAT, VERSION, HitVerifier, Trees

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


def check_splits(labels: np.ndarray, split: np.ndarray, *, least: int = 1) -> None:
    """A :class:`DataError` unless each split holds ``least`` pairs of each label: found before
    anything is embedded or trained, not as a scikit-learn or numpy error minutes later."""
    for s, name in enumerate(SPLITS):
        held = labels[split == s]
        same, different = int((held == 1).sum()), int((held == 0).sum())
        if min(same, different) < least:
            raise DataError(
                f"The {name} split holds {same} pairs labelled 1 and {different} labelled 0; train, "
                f"val and test each need at least {least} of both (pairs are split 70/15/15 by "
                "connected component of shared questions): use a larger pairs file."
            )


def fraction(text: str) -> float:
    """An argparse type: a precision target, above 0 and at most 1 (0.95, not 95)."""
    value = float(text)  # a ValueError: argparse says "invalid fraction value"
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text}")
    return value


def cosine(text: str) -> float:
    """An argparse type: a cosine similarity, from -1 to 1."""
    value = float(text)
    if not -1.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be from -1 to 1, got {text}")
    return value


def random_seed(text: str) -> int:
    """An argparse type: a seed scikit-learn takes (0 to 2**32 - 1), refused before the embedding."""
    value = int(text)
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must be from 0 to {2**32 - 1}, got {text}")
    return value


def embed_texts(
    texts: list[str], *, cache_file: Path | None = None, say: Callable[[str], None] = print
) -> dict[str, np.ndarray]:
    """Unit vectors for ``texts``, each embedded alone as the cache embeds at run time (on several
    threads, the same vectors to the bit). ``cache_file`` keeps them with the embedder's
    fingerprint: a file another embedder wrote (a new quantization recipe), or one that cannot be
    read (damaged), is embedded again."""

    from .embedder import get_embedder

    embedder = get_embedder()
    if cache_file is not None and cache_file.is_file():
        try:
            with np.load(cache_file, allow_pickle=False) as data:
                same = "embedder" in data.files and str(data["embedder"]) == embedder.fingerprint
                known = dict(zip(data["texts"].tolist(), data["vecs"], strict=True)) if same else {}
        except DAMAGED_NPZ_ERRORS as exc:
            say(f"embedding again: cannot read {cache_file} ({exc})")
            same, known = False, {}
        if same and all(t in known for t in texts):
            say(f"embeddings from {cache_file}")
            return known
    start = time.perf_counter()
    step = [10000]

    def progress(done: int, total: int) -> None:
        if done >= step[0]:
            say(f"embedded {done}/{total} in {time.perf_counter() - start:.0f}s")
            step[0] = (done // 10000 + 1) * 10000

    vecs = embedder.embed(texts, progress=progress)
    if cache_file is not None:
        tmp = cache_file.with_name(f"{cache_file.name}.{os.getpid()}.tmp.npz")  # concurrent runs
        try:  # only a shortcut for the next run: a cache dir that cannot be written loses nothing
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            save_atomically(tmp, cache_file, np.savez, texts=np.array(texts, dtype=str), vecs=vecs,
                             embedder=np.array(embedder.fingerprint))
        except OSError as exc:
            say(f"not keeping the embeddings: cannot write {cache_file} ({exc})")
    return dict(zip(texts, vecs, strict=True))


def save_atomically(tmp: Path, path: Path, save: Callable[..., None], **arrays: Any) -> None:
    """``save(tmp, **arrays)`` renamed to ``path``: a run stopped part way (Ctrl-C, a full disk)
    leaves neither a half-written ``path`` nor ``tmp`` (the embeddings' is ~150 MB)."""
    try:
        save(tmp, **arrays)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_writable(folder: Path) -> None:
    """Make ``folder`` and write a file in it, or raise the OSError now: a read-only ``--out``
    fails before the training, not after it, with the trained result lost."""
    import tempfile

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):
        pass


def featurize(
    pairs: PairSet, vecs: dict[str, np.ndarray], idx: np.ndarray, idf: Idf, *, swap: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Features with ``text_b`` as the query and ``text_a`` as the cached question (or swapped)."""
    a = [pairs.text_a[i] for i in idx]
    b = [pairs.text_b[i] for i in idx]
    if swap:
        a, b = b, a
    va = np.stack([vecs[t] for t in a])
    vb = np.stack([vecs[t] for t in b])
    return pair_features(b, a, vb, va, idf), np.einsum("nd,nd->n", va, vb)


def choose_threshold(
    probs: np.ndarray, sims: np.ndarray, labels: np.ndarray, *, min_similarity: float, target: float
) -> float:
    """The lowest threshold whose precision on these pairs is at least ``target``.

    Counted only from 50 hits on, so a handful of lucky pairs does not set it. When no threshold
    reaches ``target``, the one with the highest precision (from 50 hits on) is returned.
    """
    eligible = sims >= min_similarity
    order = np.argsort(-probs[eligible])
    sorted_probs = probs[eligible][order]
    num_hits = np.arange(1, len(order) + 1)
    precision = np.cumsum(labels[eligible][order]) / num_hits
    precision[num_hits < min(50, len(order))] = -1.0
    # a threshold takes every pair of its probability: within a run of equal probabilities only
    # the run's end is a precision some threshold gives
    precision[:-1][sorted_probs[:-1] == sorted_probs[1:]] = -1.0
    ok = np.nonzero(precision >= target)[0]
    if len(ok):
        return float(sorted_probs[ok[-1]])
    if len(order) == 0:
        return 1.0
    best = np.nonzero(precision == precision.max())[0][-1]
    return float(sorted_probs[best])


def _fit_linear(x: np.ndarray, y: np.ndarray, groups: np.ndarray):
    """Logistic regression over all features, and its out-of-fold logits on ``x``."""
    from sklearn.linear_model import LogisticRegression

    mean = x.mean(0)
    scale = x.std(0) + 1e-6
    xs = (x - mean) / scale
    oof = np.empty(len(x))
    folds = groups % 3  # a pair and its swapped copy stay in one fold
    for fold in range(3):
        held = folds == fold
        lr = LogisticRegression(C=0.01, max_iter=500).fit(xs[~held], y[~held])
        oof[held] = lr.decision_function(xs[held])
    lr = LogisticRegression(C=0.01, max_iter=500).fit(xs, y)
    linear = (lr.coef_[0].astype(np.float32), float(lr.intercept_[0]), mean, scale)
    return linear, oof


def train(
    data: Path,
    out_dir: Path,
    *,
    target_precision: float = 0.95,
    min_similarity: float = 0.5,
    seed: int = 0,
    say: Callable[[str], None] = print,
) -> dict[str, float]:
    from sklearn.ensemble import HistGradientBoostingClassifier

    pairs = load_pairs(data)
    split = split_of_pairs(pairs, seed=seed)
    labels = np.asarray(pairs.labels, dtype=np.int8)
    check_splits(labels, split)
    check_writable(out_dir)  # a bad --out fails now, not after the training
    texts = sorted(set(pairs.text_a) | set(pairs.text_b))
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    vecs = embed_texts(texts, cache_file=cache_dir() / "train" / f"qqp-{digest}.npz", say=say)
    tr, va, te = (np.nonzero(split == s)[0] for s in range(3))
    say(f"pairs: train {len(tr)}, val {len(va)}, test {len(te)}")
    idf = Idf.fit(sorted({pairs.text_a[i] for i in tr} | {pairs.text_b[i] for i in tr}))

    x_fwd, _ = featurize(pairs, vecs, tr, idf)
    x_rev, _ = featurize(pairs, vecs, tr, idf, swap=True)
    x_train = np.concatenate([x_fwd, x_rev])
    y_train = np.concatenate([labels[tr], labels[tr]])
    groups = np.concatenate([np.arange(len(tr)), np.arange(len(tr))])
    say(f"linear stage on {len(x_train)} pairs x {x_train.shape[1]} features")
    linear, oof = _fit_linear(x_train, y_train, groups)
    say("boosted trees over surface features + linear logit")
    gbt = HistGradientBoostingClassifier(
        max_iter=400, learning_rate=0.05, max_leaf_nodes=31, l2_regularization=1.0, random_state=seed
    )
    tree_x = np.concatenate([x_train[:, :NUM_HANDCRAFTED], oof[:, None]], axis=1)
    gbt.fit(tree_x, y_train)
    verifier = HitVerifier(
        trees_from_sklearn(gbt),
        idf=idf,
        linear=linear,
        threshold=0.5,
        min_similarity=min_similarity,
    )
    x_val, sims_val = featurize(pairs, vecs, va, idf)
    p_val = verifier.predict_features(x_val)
    check = gbt.predict_proba(verifier.tree_inputs(x_val))[:, 1]
    if not np.allclose(p_val, check, atol=1e-5):  # the export must reproduce scikit-learn
        raise RuntimeError("exported trees disagree with scikit-learn")
    verifier.threshold = choose_threshold(
        p_val, sims_val, labels[va], min_similarity=min_similarity, target=target_precision
    )
    x_test, sims_test = featurize(pairs, vecs, te, idf)
    p_test = verifier.predict_features(x_test)
    metrics = {
        f"test_{k}": v for k, v in pair_metrics(verifier.accept(p_test, sims_test), labels[te]).items()
    }
    val_hits = verifier.accept(p_val, sims_val)
    metrics.update({f"val_{k}": v for k, v in pair_metrics(val_hits, labels[va]).items()})
    for name, scores in (("verifier", p_test), ("cosine", sims_test)):
        for recall in (0.1, 0.2, 0.3, 0.4):
            key = f"test_{name}_precision_at_recall_{recall}"
            metrics[key] = precision_at_recall(scores, labels[te], recall)
    metrics.update(threshold=verifier.threshold, seed=seed, target_precision=target_precision)
    verifier.metrics = metrics
    save_verifier(verifier, out_dir / DEFAULT_NAME)
    say(f"wrote {out_dir / DEFAULT_NAME}")
    return metrics


def trees_from_sklearn(model: Any) -> Trees:
    """The node arrays of a fitted binary ``HistGradientBoostingClassifier`` (numeric features only)."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in _TREE_FIELDS if k != "roots"}
    roots, offset = [], 0
    for (predictor,) in model._predictors:
        nodes = predictor.nodes
        roots.append(offset)
        parts["feature"].append(nodes["feature_idx"].astype(np.int32))
        parts["threshold"].append(nodes["num_threshold"].astype(np.float64))
        parts["left"].append(nodes["left"].astype(np.int32) + offset)
        parts["right"].append(nodes["right"].astype(np.int32) + offset)
        parts["value"].append(nodes["value"].astype(np.float64))
        parts["is_leaf"].append(nodes["is_leaf"].astype(bool))
        offset += len(nodes)
    return Trees(
        **{k: np.concatenate(v) for k, v in parts.items()},
        roots=np.asarray(roots, dtype=np.int32),
        baseline=float(np.ravel(model._baseline_prediction)[0]),
    )


def save_verifier(verifier: HitVerifier, path: str | Path) -> Path:
    """Write ``verifier`` as plain arrays (read back by :meth:`.HitVerifier.load`), atomically."""
    path = Path(path)
    names = sorted(verifier.metrics)
    words = sorted(verifier.idf.weights)
    arrays: dict[str, np.ndarray] = {
        "format": np.array(FORMAT),
        "version": np.array(VERSION),
        "threshold": np.array(verifier.threshold),
        "min_similarity": np.array(verifier.min_similarity),
        "metric_names": np.array(names, dtype=str),
        "metric_values": np.array([verifier.metrics[k] for k in names], dtype=np.float64),
        "idf_words": np.array(words, dtype=str),
        "idf_values": np.array([verifier.idf.weights[w] for w in words], dtype=np.float32),
        "idf_default": np.array(verifier.idf.default),
        "tree_baseline": np.array(verifier.trees.baseline),
    }
    for field in _TREE_FIELDS:
        arrays[f"tree_{field}"] = getattr(verifier.trees, field)
    if verifier.linear is not None:
        w, b, mean, scale = verifier.linear
        arrays.update(lin_w=w, lin_b=np.array(b), lin_mean=mean, lin_scale=scale)
    save_atomically(path.with_name(path.name + ".tmp.npz"), path, np.savez_compressed, **arrays)
    return path


def precision_at_recall(scores: np.ndarray, labels: np.ndarray, recall: float) -> float:
    """Precision of the top-scored pairs that hold ``recall`` of the positives."""
    order = np.argsort(-scores)
    correct = np.cumsum(labels[order])
    k = int(np.searchsorted(correct / max(labels.sum(), 1), recall))
    return float(correct[min(k, len(order) - 1)] / (min(k, len(order) - 1) + 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridllm.cache.train", description=__doc__)
    parser.add_argument("--data", type=Path, required=True, help="JSONL: text_a, text_b, label")
    parser.add_argument("--out", type=Path, default=Path("hybridllm/_data"),
                        help="folder for cache_verifier.npz (default: hybridllm/_data)")
    parser.add_argument("--target-precision", type=fraction, default=0.95,
                        help="the lowest threshold with this validation precision (default: 0.95)")
    parser.add_argument("--min-similarity", type=cosine, default=0.5,
                        help="cosine below which a candidate is never a hit (default: 0.5)")
    parser.add_argument("--seed", type=random_seed, default=0, help="split and training seed (default: 0)")
    args = parser.parse_args(argv)
    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731 - the JSON goes to stdout
    try:
        metrics = train(
            args.data,
            args.out,
            target_precision=args.target_precision,
            min_similarity=args.min_similarity,
            seed=args.seed,
            say=say,
        )
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (HybridLLMError, OSError) as exc:  # the embedder's model, a folder that cannot be written
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the verifier file is written atomically: the old one is intact
        print("interrupted: the verifier file is only replaced by a finished one", file=sys.stderr)
        return 130
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
