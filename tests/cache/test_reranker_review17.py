"""The reranker's pair checks and scores (review 17): a pair whose texts hold characters the
tokenizer reads as ``[UNK]`` (or deletes) is not read whole, so it is never verified as "same";
a graph that gives NaN never passes a pair.

Fast: the real MiniLM tokenizer, a stand-in for the ONNX graph (no model run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridllm.cache import SemanticCache
from hybridllm.cache import encoder as encoder_module
from hybridllm.cache.embedder import DIM
from hybridllm.cache.encoder import OnnxEncoder
from hybridllm.cache.reranker import MAX_TOKENS, Reranker, RerankVerifier, read_info

KW = {"model": "m", "params_key": {"temperature": 0}}
# each pair: two different questions the tokenizer makes equal ([UNK] for each emoji, the
# private-use glyphs deleted), then a pair it reads whole
UNREAD = [
    ("Is this 🍄 edible?", "Is this 🌿 edible?"),
    ("Where do I buy \ue001 products?", "Where do I buy \ue002 products?"),
    ("Is this \ud83c edible?", "Is this edible?"),  # half an emoji (U+FFFD, deleted)
]
READ = [
    ("How do I learn Python?", "How can I learn Python?"),
    ("Wie spät ist es in Zürich?", "Uhrzeit Zürich?"),
]


class ConstantGraph:
    """Stands in for the ONNX session: the same logit for every pair."""

    def __init__(self, logit: float) -> None:
        self.logit = logit

    def run(self, _names: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [np.full((len(feeds["input_ids"]), 1), self.logit, dtype=np.float32)]


def _reranker(folder: Path, mp: pytest.MonkeyPatch, logit: float) -> Reranker:
    mp.setattr(encoder_module, "cpu_session", lambda _ort, _path, _threads: ConstantGraph(logit))
    model = Reranker.__new__(Reranker)
    OnnxEncoder.__init__(model, folder, quantized=True, num_threads=None, max_tokens=MAX_TOKENS)
    model.info = read_info()
    model.__dict__["logit_range"] = (-40.0, 40.0)  # no range file read or written beside the tokenizer
    return model


def _verifier(reranker: Reranker) -> RerankVerifier:
    verifier = RerankVerifier(reranker, threshold=0.5)
    verifier.stack = None  # the reranker's probability alone: what the graph said
    return verifier


def _unit(n: int) -> np.ndarray:
    return np.full((n, DIM), 1.0 / np.sqrt(DIM), dtype=np.float32)


def test_a_pair_with_unknown_or_deleted_characters_is_not_read_whole(
    minilm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reranker = _reranker(minilm_dir, monkeypatch, 10.0)
    pairs = UNREAD + READ
    # the tokenizer does make each unread pair's two questions one input
    for q, c in UNREAD[:2]:
        assert reranker.encode([q])[0].ids == reranker.encode([c])[0].ids
    expected = [False] * len(UNREAD) + [True] * len(READ)
    assert reranker.fits_pairs(pairs).tolist() == expected
    _, whole = reranker.logits_and_fits([q for q, _ in pairs], [c for _, c in pairs])
    assert whole.tolist() == expected


@pytest.mark.parametrize("at_least", [None, 0.5])
def test_the_reranker_never_verifies_questions_it_cannot_tell_apart(
    minilm_dir: Path, monkeypatch: pytest.MonkeyPatch, at_least: float | None
) -> None:
    """Before: "Is this 🍄 edible?" against "Is this 🌿 edible?" scored as sure as a true match."""
    verifier = _verifier(_reranker(minilm_dir, monkeypatch, 10.0))
    pairs = UNREAD + READ
    probs = verifier.predict([q for q, _ in pairs], [c for _, c in pairs], _unit(len(pairs)),
                             _unit(len(pairs)), at_least=at_least)
    assert probs[: len(UNREAD)].tolist() == [0.0] * len(UNREAD)
    assert (probs[len(UNREAD) :] > 0.99).all()


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_the_cache_serves_one_emoji_question_only_its_own_answer(
    tmp_path: Path, minilm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller's own vectors (no embedder to check the texts): the reranker is the last check."""
    verifier = _verifier(_reranker(minilm_dir, monkeypatch, 10.0))
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=verifier, min_similarity=0.5)
    vec = _unit(1)[0]
    cache.put(user("Is this 🍄 edible?"), "Yes, a button mushroom.", embedding=vec, **KW)
    hit = cache.get(user("Is this 🌿 edible?"), embedding=vec, **KW)
    assert hit is None
    hit = cache.get(user("Is this 🍄 edible?"), embedding=vec, **KW)
    assert hit is not None and hit.text == "Yes, a button mushroom."  # the exact repeat still hits
    cache.close()


def test_a_nan_logit_never_passes(tmp_path: Path, minilm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A damaged graph giving NaN: before, the pair scored NaN, which ``probs[best] < threshold``
    does not refuse, and the cache served any nearest question's answer."""
    verifier = _verifier(_reranker(minilm_dir, monkeypatch, float("nan")))
    probs = verifier.predict([READ[0][0]], [READ[0][1]], _unit(1), _unit(1))
    assert probs.tolist() == [0.0]
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=verifier, min_similarity=0.5)
    vec = _unit(1)[0]
    cache.put(user("What is the capital of France?"), "Paris", embedding=vec, **KW)
    assert cache.get(user("What is the capital of Peru?"), embedding=vec, **KW) is None
    cache.close()


@pytest.mark.parametrize("threshold", [float("nan"), 0.0, -0.5, 1.5, float("inf"), "high", True])
def test_a_threshold_that_is_not_a_probability_is_refused(
    minilm_dir: Path, monkeypatch: pytest.MonkeyPatch, threshold: object
) -> None:
    """Before: NaN (or above 1) made a cache that never hit, 0 or below served the pairs the
    reranker did not read whole (scored 0.0), "high" raised a bare ValueError."""
    from hybridllm import ConfigError

    reranker = _reranker(minilm_dir, monkeypatch, 10.0)
    with pytest.raises(ConfigError, match="threshold"):
        RerankVerifier(reranker, threshold=threshold)
    assert RerankVerifier(reranker, threshold=1).threshold == 1.0


def test_a_file_threshold_that_is_not_a_probability_is_refused(
    minilm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from hybridllm import CacheError

    reranker = _reranker(minilm_dir, monkeypatch, 10.0)
    reranker.info = dataclasses.replace(reranker.info, threshold=float("nan"))
    with pytest.raises(CacheError, match=str(reranker.info.path)):
        RerankVerifier(reranker)
    assert RerankVerifier(reranker, threshold=0.9).threshold == 0.9  # the caller's own is used
