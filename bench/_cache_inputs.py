"""bench.cache's inputs: QQP questions, the reworded hit pairs, the lookup corpus, the verified set."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT.parent / "shared" / "data" / "paraphrase" / "qqp_pairs.jsonl"
FALLBACK = [
    "How do I learn Python?",
    "What is the capital of France?",
    "Why is the sky blue?",
    "How can I lose weight fast?",
    "What is the best way to learn guitar?",
] * 40

HIT_PAIRS = [  # (cached, asked): same question, reworded
    ("How can I improve my English speaking skills?", "How do I improve my spoken English?"),
    ("What is the best way to learn Python?", "What's the best way to learn Python?"),
    ("How do I lose weight quickly?", "How can I lose weight fast?"),
]


def _questions(n: int) -> list[str]:
    if not PAIRS.is_file():
        return FALLBACK[:n]
    out: list[str] = []
    with open(PAIRS) as fh:
        for line in fh:
            out.append(json.loads(line)["text_b"])
            if len(out) >= n:
                break
    return out


def _corpus(embedder, n: int) -> np.ndarray:
    """``[n, 384]`` unit vectors: the QQP embeddings that training cached, if any, then noise."""
    from hybridllm._paths import cache_dir

    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((n, embedder.dim)).astype(np.float32)
    real = sorted((cache_dir() / "train").glob("qqp-*.npz"))
    if real:
        with np.load(real[0], allow_pickle=False) as data:
            have = data["vecs"][:n]
        vecs[: len(have)] = have
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def _verified_set(n: int, num_queries: int) -> tuple[list[str], list[tuple[str, str, int]]]:
    """(``n`` distinct cached questions, ``num_queries`` (asked, its pair's question, label)): the
    asked questions are the ``text_b`` of QQP test-split pairs whose ``text_a`` is cached."""
    from hybridllm.cache.evaluate import load_pairs
    from hybridllm.cache.guards import exact_key
    from hybridllm.cache.train import split_of_pairs

    pairs = load_pairs(PAIRS)
    test = split_of_pairs(pairs) == 2
    order = [i for i in range(len(pairs)) if test[i]] + [i for i in range(len(pairs)) if not test[i]]
    entries: dict[str, str] = {}  # exact key -> question
    for i in order:
        for text in (pairs.text_a[i],) if test[i] else (pairs.text_a[i], pairs.text_b[i]):
            if len(entries) < n:
                entries.setdefault(exact_key(text), text)
    asked = [
        (pairs.text_b[i], pairs.text_a[i], pairs.labels[i])
        for i in range(len(pairs))
        if test[i] and entries.get(exact_key(pairs.text_a[i])) == pairs.text_a[i]
        and exact_key(pairs.text_b[i]) not in entries
    ]
    return list(entries.values()), asked[:num_queries]
