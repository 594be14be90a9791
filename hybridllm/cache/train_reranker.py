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
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._cli_options import positive_float, positive_int
from .._exceptions import DataError, HybridLLMError
from .._paths import cache_dir
from .encoder import pad_batch
from .evaluate import PairSet, load_pairs, pair_metrics
from .prepare import EMBEDDER_ID, reranker_dir
from .reranker import MAX_TOKENS, Reranker, stack_inputs
from .reranker_file import (
    DEFAULT_NAME,
    DELTA_PREFIX,
    FORMAT,
    VERSION,
    Stack,
    base_cross_encoder_weights,
    file_digest,
    read_info,
)
from .train import (
    check_splits,
    check_writable,
    choose_threshold,
    cosine,
    embed_texts,
    featurize,
    fraction,
    precision_at_recall,
    save_atomically,
    split_of_pairs,
)
from .verifier import HitVerifier
from .verifier import default_path as features_default_path

Say = Callable[[str], None]


Item = tuple[str, str, int]  # (query, cached, label)


def training_items(pairs: PairSet, idx: np.ndarray) -> list[Item]:
    """The labelled pairs at ``idx`` as (query, cached, label): the cache compares a new question
    (``text_b``) with a stored one (``text_a``)."""
    return [(pairs.text_b[i], pairs.text_a[i], pairs.labels[i]) for i in idx]


def _batches(items: list[Item], batch_size: int, rng: random.Random) -> list[list[Item]]:
    """Shuffled batches of both orders of every item, grouped by length."""
    both = [(q, c, label) for q, c, label in items] + [(c, q, label) for q, c, label in items]
    rng.shuffle(both)
    out = []
    chunk = batch_size * 100  # sort within chunks so a batch pads little but stays random
    for start in range(0, len(both), chunk):
        part = sorted(both[start : start + chunk], key=lambda t: len(t[0]) + len(t[1]))
        out += [part[k : k + batch_size] for k in range(0, len(part), batch_size)]
    rng.shuffle(out)
    return out


def _tensors(tokenizer: Any, batch: list[Item]) -> tuple[Any, ...]:
    import torch

    ids, mask, types = pad_batch(tokenizer.encode_batch([(q, c) for q, c, _ in batch]))
    labels = torch.tensor([float(label) for _, _, label in batch])
    return torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types), labels


def _cpu_has_bf16() -> bool:
    """bf16 autocast pays on CPUs with native bf16 math (AVX512-BF16, AMX); elsewhere fp32 is faster."""
    import torch

    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # private helpers of torch.cpu: fall back to fp32
        return False


def fine_tune(
    items: list[Item],
    *,
    epochs: float,
    lr: float,
    batch_size: int,
    threads: int,
    seed: int,
    say: Say,
) -> dict[str, np.ndarray]:
    """Fine-tune the cross-encoder; return its weights (word embeddings left out) as arrays."""
    import torch
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    from ..models import pull
    from .export import cross_encoder_module
    from .onnx_graph import remap

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    rng = random.Random(seed)
    source = pull(EMBEDDER_ID)
    model = cross_encoder_module(json.loads((source / "config.json").read_text()))
    model.encoder.load_state_dict(remap(load_file(str(source / "model.safetensors"))), strict=True)
    model.encoder.word.weight.requires_grad_(False)  # shipped weights then need no vocabulary table
    model.train()
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_TOKENS)

    batches: list[list[Item]] = []
    total = max(1, int(round(epochs * len(items) * 2 / batch_size)))
    while len(batches) < total:
        batches += _batches(items, batch_size, rng)
    batches = batches[:total]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    warmup = max(1, int(0.06 * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.0, (total - s) / max(1, total - warmup)))
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    amp = device == "cuda" or _cpu_has_bf16()
    precision = "bf16 autocast" if amp else "fp32"
    say(f"fine-tuning on {len(items)} pairs (both orders): {total} steps of {batch_size}, "
        f"{device}, {precision}")
    start = time.perf_counter()
    running = None
    for step, batch in enumerate(batches):
        ids, mask, types, labels = (t.to(device) for t in _tensors(tokenizer, batch))
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            logits = model(ids, mask, types)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), labels)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if (step + 1) % 200 == 0 or step + 1 == total:
            spent = time.perf_counter() - start
            eta = spent / (step + 1) * (total - step - 1)
            say(f"step {step + 1}/{total}  loss {running:.4f}  {spent:.0f}s spent, about {eta:.0f}s left")
    return {
        name: tensor.detach().float().cpu().numpy()
        for name, tensor in model.state_dict().items()
        if name != "encoder.word.weight"
    }


def _write(path: Path, arrays: dict[str, np.ndarray], *, threshold: float, min_similarity: float,
           digest: str, metrics: dict[str, float], stack: Stack | None = None) -> None:
    names = sorted(metrics)
    extra: dict[str, np.ndarray] = {}
    if stack is not None:
        extra = {
            "stack_w": stack.weights,
            "stack_b": np.array(stack.bias),
            "stack_mean": stack.mean,
            "stack_scale": stack.scale,
            "features_digest": np.array(stack.features_digest),
        }
    fields: dict[str, np.ndarray] = {
        "format": np.array(FORMAT),
        "version": np.array(VERSION),
        "threshold": np.array(threshold),
        "min_similarity": np.array(min_similarity),
        "weights_digest": np.array(digest),
        "metric_names": np.array(names, dtype=str),
        # an undefined rate (None: no test hit) is stored as NaN
        "metric_values": np.array([np.nan if metrics[k] is None else float(metrics[k]) for k in names],
                                  dtype=np.float64),
        **extra,
        **arrays,
    }
    save_atomically(path.with_name(path.name + ".tmp.npz"), path, np.savez_compressed, **fields)


DELTA_RANK = 64  # rank of the stored fine-tuning change of each layer matrix


def _int8_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per row, and the row scales."""
    scale = np.abs(w).max(axis=1) / 127.0
    scale[scale == 0] = 1.0
    return np.clip(np.round(w / scale[:, None]), -127, 127).astype(np.int8), scale.astype(np.float32)


def pack_weights(
    weights: dict[str, np.ndarray], base: dict[str, Any], *, rank: int = DELTA_RANK
) -> dict[str, np.ndarray]:
    """Arrays to save: each layer matrix as a rank-``rank`` change to ``base`` (two int8 factors
    with row scales, from a truncated SVD), the rest float32.

    The fine-tuning change is close to low-rank: at rank 64 the logits keep a correlation of 0.997
    with the full weights, and the file is 3 MB instead of 10 MB of int8 matrices.
    """
    arrays: dict[str, np.ndarray] = {}
    for name in sorted(weights):
        w = np.asarray(weights[name], dtype=np.float32)
        if w.ndim == 2 and name.endswith(".weight") and "layers." in name:
            delta = w - np.asarray(base[name], dtype=np.float32)
            u, s, vt = np.linalg.svd(delta, full_matrices=False)
            r = min(rank, len(s))
            arrays[f"{DELTA_PREFIX}{name}"], arrays[f"scale_u:{name}"] = _int8_rows(u[:, :r] * s[:r])
            arrays[f"v:{name}"], arrays[f"scale_v:{name}"] = _int8_rows(vt[:r])
        else:
            arrays[f"w:{name}"] = w
    return arrays


def weights_digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for key in sorted(arrays):
        h.update(key.encode())
        h.update(np.ascontiguousarray(arrays[key]).tobytes())
    return h.hexdigest()[:16]


def _base_weights() -> dict[str, np.ndarray]:
    from ..models import pull
    return base_cross_encoder_weights(pull(EMBEDDER_ID))


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The weight arrays of a reranker file, as stored (for recalibration)."""
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files if k.startswith(("w:", "u:", "v:", "scale_u:", "scale_v:"))}


def fit_stack(
    x: np.ndarray, y: np.ndarray, *, features_digest: str, folds: int = 2
) -> tuple[Stack, np.ndarray]:
    """The stacking regression on ``x`` and its out-of-fold probabilities (to set the threshold)."""
    from sklearn.linear_model import LogisticRegression

    if min(int((y == 1).sum()), int((y == 0).sum())) < 2 * folds:
        raise DataError(
            f"Too few validation pairs to calibrate the reranker ({int(y.sum())} same, "
            f"{int((y == 0).sum())} different); use a larger pairs file."
        )
    mean = x.mean(0)
    scale = x.std(0) + 1e-6
    xs = (x - mean) / scale
    oof = np.empty(len(x))
    fold = np.arange(len(x)) % folds
    for k in range(folds):
        model = LogisticRegression(C=1.0, max_iter=3000).fit(xs[fold != k], y[fold != k])
        oof[fold == k] = model.decision_function(xs[fold == k])
    model = LogisticRegression(C=1.0, max_iter=3000).fit(xs, y)
    stack = Stack(weights=model.coef_[0].astype(np.float64), bias=float(model.intercept_[0]), mean=mean,
                  scale=scale, features_digest=features_digest)
    return stack, 1.0 / (1.0 + np.exp(-oof))


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


def _calibrate(pairs: PairSet, split: np.ndarray, vecs: dict[str, np.ndarray], interim: Path, path: Path,
               arrays: dict[str, np.ndarray], wd: str, metrics: dict[str, float], *, threads: int,
               target_precision: float, min_similarity: float, say: Say) -> dict[str, float]:
    """Score the validation and test splits with the int8 model of ``interim``, fit the stack and
    the threshold, and write the finished reranker file to ``path``."""
    labels = np.asarray(pairs.labels, dtype=np.int8)
    va, te = np.nonzero(split == 1)[0], np.nonzero(split == 2)[0]
    say(f"preparing the int8 ONNX model in {reranker_dir(wd)}")
    reranker = Reranker(interim, num_threads=threads)
    features = HitVerifier.load(features_default_path())

    def inputs(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Reranker logits, stack inputs and cosines, the cache's way round (text_b asks)."""
        logits = reranker.logits([pairs.text_b[i] for i in idx], [pairs.text_a[i] for i in idx])
        feats, sims = featurize(pairs, vecs, idx, features.idf)
        return logits, stack_inputs(logits, feats, features), sims

    say("scoring the validation and test splits with the int8 ONNX model")
    (z_val, x_val, s_val), (z_test, x_test, s_test) = inputs(va), inputs(te)
    y_val, y_test = labels[va].astype(np.float64), labels[te]
    stack, p_val = fit_stack(x_val, y_val, features_digest=file_digest(features_default_path()))
    p_test = 1.0 / (1.0 + np.exp(-stack.logit(x_test)))
    threshold = choose_threshold(p_val, s_val, y_val, min_similarity=min_similarity, target=target_precision)
    hits_val = (s_val >= min_similarity) & (p_val >= threshold)
    hits_test = (s_test >= min_similarity) & (p_test >= threshold)
    metrics.update({f"val_{k}": v for k, v in pair_metrics(hits_val, labels[va]).items()})
    metrics.update({f"test_{k}": v for k, v in pair_metrics(hits_test, labels[te]).items()})
    # the reranker alone, at its own validation threshold, for comparison
    alone_val, alone_test = 1 / (1 + np.exp(-z_val)), 1 / (1 + np.exp(-z_test))
    t_alone = choose_threshold(alone_val, s_val, y_val, min_similarity=min_similarity,
                               target=target_precision)
    alone = pair_metrics((s_test >= min_similarity) & (alone_test >= t_alone), y_test)
    metrics.update(test_reranker_alone_precision=alone["precision"],
                   test_reranker_alone_recall=alone["recall"])
    for name, scores in (("stacked", np.where(s_test >= min_similarity, p_test, 0.0)),
                         ("reranker", np.where(s_test >= min_similarity, alone_test, 0.0)),
                         ("cosine", s_test)):
        for recall in (0.2, 0.4, 0.6):
            metrics[f"test_{name}_precision_at_recall_{recall}"] = precision_at_recall(scores, y_test, recall)
    metrics.update(threshold=threshold, target_precision=target_precision)
    _write(path, arrays, threshold=threshold, min_similarity=min_similarity, digest=wd, metrics=metrics,
           stack=stack)
    say(f"wrote {path}")
    return metrics


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
