"""Fine-tune the cache reranker on labelled question pairs; write ``hybridllm/_data/cache_reranker.npz``.

    python -m hybridllm.cache.train_reranker \\
        --data ../shared/data/paraphrase/qqp_pairs.jsonl --out hybridllm/_data/

Needs the ``[export]`` extra (torch; ``--calibrate-only`` does not). The split is the feature
verifier's (:func:`split_of_pairs`: 70/15/15 by connected component of shared questions, so no
validation or test question is seen in training). all-MiniLM-L6-v2 becomes a cross-encoder (``[CLS]
query [SEP] cached [SEP]``, mean pooling, a linear head) and is fine-tuned with binary cross-entropy
on both orders of every training pair, word embeddings frozen, bf16 autocast on CPUs that support
it. The weights are then exported to the int8 ONNX model the cache runs, and that model, not the
PyTorch one, scores the validation split to set the operating threshold (the lowest whose precision
reaches ``--target-precision``) and the untouched test split to report precision, recall and
false-hit rate under the cache's own protocol (``text_a`` cached, ``text_b`` asked).

One epoch over 39,476 training pairs takes about 15 minutes on one core of a recent Xeon.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from .._cli_options import positive_float, positive_int
from .._exceptions import DataError, HybridLLMError
from .._paths import cache_dir
from ._reranker_calibration import _calibrate
from ._reranker_tuning import Say, fine_tune, training_items
from ._reranker_weights import _base_weights, _read_arrays, _write, pack_weights, weights_digest
from .evaluate import load_pairs
from .reranker_file import DEFAULT_NAME, read_info
from .train import (
    check_splits,
    check_writable,
    cosine,
    embed_texts,
    fraction,
    split_of_pairs,
)


def train(
    data: Path,
    out_dir: Path,
    *,
    epochs: float = 1.0,
    lr: float = 4e-5,
    batch_size: int = 32,
    threads: int = 1,
    target_precision: float = 0.95,
    min_similarity: float = 0.5,
    seed: int = 0,
    calibrate_only: bool = False,
    say: Say = print,
) -> dict[str, float]:
    """Fine-tune (unless ``calibrate_only``), then fit the stack and threshold; return the metrics."""
    pairs = load_pairs(data)
    split = split_of_pairs(pairs, seed=seed)
    labels = np.asarray(pairs.labels, dtype=np.int8)
    check_splits(labels, split, least=4)  # fit_stack's need (2 folds x 2), known before fine-tuning
    tr, va, te = (np.nonzero(split == s)[0] for s in range(3))
    say(f"pairs: train {len(tr)}, val {len(va)}, test {len(te)}")
    check_writable(out_dir)  # the fine-tuned weights must have somewhere to go
    path = out_dir / DEFAULT_NAME
    metrics: dict[str, float] = {}
    if calibrate_only:  # read first: a missing or damaged file is said before the embedding
        old = read_info(path).metrics
        arrays = _read_arrays(path)
        metrics.update({k: old[k] for k in _TRAINING_KEYS if k in old})
    texts = sorted(set(pairs.text_a) | set(pairs.text_b))
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    vecs = embed_texts(texts, cache_file=cache_dir() / "train" / f"qqp-{digest}.npz", say=say)
    if not calibrate_only:
        started = time.perf_counter()
        items = training_items(pairs, tr)
        say(f"training pairs: {len(items)}")
        weights = fine_tune(items, epochs=epochs, lr=lr, batch_size=batch_size, threads=threads, seed=seed,
                            say=say)
        arrays = pack_weights(weights, _base_weights())
        metrics.update(epochs=epochs, lr=lr, batch_size=batch_size, seed=seed,
                       train_minutes=round((time.perf_counter() - started) / 60, 1))
    wd = weights_digest(arrays)
    # The weights go to a file of their own until calibrated: OUT/cache_reranker.npz (which the
    # cache may be using) is only replaced by the finished file, never by an uncalibrated one.
    interim = out_dir / UNCALIBRATED_NAME
    _write(interim, arrays, threshold=0.5, min_similarity=min_similarity, digest=wd, metrics=metrics)
    try:
        metrics = _calibrate(pairs, split, vecs, interim, path, arrays, wd, metrics, threads=threads,
                             target_precision=target_precision, min_similarity=min_similarity, say=say)
    except BaseException:
        if calibrate_only:
            interim.unlink(missing_ok=True)  # the weights are still in OUT/cache_reranker.npz
        else:
            say(f"calibration failed; the fine-tuned weights are kept in {interim}: rename it to "
                f"{DEFAULT_NAME} and run again with --calibrate-only")
        raise
    interim.unlink(missing_ok=True)
    return metrics


UNCALIBRATED_NAME = "cache_reranker.uncalibrated.npz"



_TRAINING_KEYS = ("epochs", "lr", "batch_size", "seed", "train_minutes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridllm.cache.train_reranker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="JSONL: text_a, text_b, label")
    parser.add_argument(
        "--out", type=Path, default=Path("hybridllm/_data"), help="folder for cache_reranker.npz"
    )
    parser.add_argument("--epochs", type=positive_float, default=1.0,
                        help="passes over the pairs (default: 1.0)")
    parser.add_argument("--lr", type=positive_float, default=4e-5, help="learning rate (default: 4e-05)")
    parser.add_argument("--batch-size", type=positive_int, default=32,
                        help="pairs a training step (default: 32)")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="CPU threads for training and scoring")
    parser.add_argument("--target-precision", type=fraction, default=0.95,
                        help="the lowest threshold with this validation precision (default: 0.95)")
    parser.add_argument("--min-similarity", type=cosine, default=0.5,
                        help="cosine below which a candidate is not scored")
    parser.add_argument("--seed", type=int, default=0, help="split and training seed (default: 0)")
    parser.add_argument("--calibrate-only", action="store_true",
                        help="keep the weights in OUT/cache_reranker.npz; refit the stack and threshold")
    args = parser.parse_args(argv)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731 - the JSON goes to stdout
    try:
        if not args.calibrate_only:  # calibrating runs the ONNX model: no torch
            import torch  # noqa: F401
    except ImportError:
        print("error: training the reranker needs torch: pip install 'hybridllm[export]'", file=sys.stderr)
        return 2
    try:
        metrics = train(args.data, args.out, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                        threads=args.threads,
                        target_precision=args.target_precision, min_similarity=args.min_similarity,
                        seed=args.seed, calibrate_only=args.calibrate_only, say=say)
    except (DataError, HybridLLMError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a folder that cannot be written
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # what was kept, if anything, has been said
        print("interrupted", file=sys.stderr)
        return 130
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
