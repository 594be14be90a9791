"""A candidate's score and decision depend on that pair alone, not on the candidates scored with it.

Before: the reranker scored a lookup's candidates in one batch. The int8 graph quantizes its
activations with one scale per run (DynamicQuantizeLinear over the whole tensor, padding included),
so a pair's logit moved with the other candidates the lookup found (up to 0.78 on QQP lookups), and
whether a question was served could depend on unrelated cached entries (``hybridllm cache eval``
scores each pair alone, in its own namespace). Now each pair is its own graph run, in lookups and
evaluation alike; the logit-range shortcut then skips each pair that cannot pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridllm.cache import SemanticCache
from hybridllm.cache import encoder as encoder_module
from hybridllm.cache.encoder import OnnxEncoder
from hybridllm.cache.reranker import MAX_TOKENS, Reranker, RerankVerifier, read_info

from .fakes import FakeEmbedder
from .test_lookup_cost import ASKED, KW, user
from .test_lookup_cost import CANDIDATES as _CANDIDATES

CANDIDATES = [*_CANDIDATES, "How can I learn to speak English well and with confidence at work?"]


def _vecs(texts: list[str]) -> np.ndarray:
    return np.stack([FakeEmbedder().embed_one(t) for t in texts])


# ---------------------------------------------------------------------- fast: a batch-dependent graph


class BatchScaledGraph:
    """Stands in for the int8 reranker session: a pair's logit in [-1, 3] from its token ids,
    moved by the batch's shape and its largest id (as one quantization scale per run moves it)."""

    def __init__(self) -> None:
        self.rows: list[int] = []  # pairs per run

    def run(self, _names: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        self.rows.append(len(ids))
        raw = (ids * mask).sum(axis=1) % 89 / 89.0 + ids.size / 5000.0 + ids.max() / 1e6
        return [np.clip(4.0 * raw - 1.0, -1.0, 3.0).astype(np.float32)[:, None]]


@pytest.fixture
def fake(minilm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[RerankVerifier, BatchScaledGraph]:
    """The shipped stack, feature verifier and tokenizer over :class:`BatchScaledGraph`, whose
    logit range is [-1, 3]; the verifier as a cache builds it (default batch size)."""
    graph = BatchScaledGraph()
    monkeypatch.setattr(encoder_module, "cpu_session", lambda _ort, _path, _threads: graph)
    reranker = Reranker.__new__(Reranker)
    OnnxEncoder.__init__(reranker, minilm_dir, quantized=True, num_threads=None, max_tokens=MAX_TOKENS)
    reranker.info = read_info()
    reranker.__dict__["logit_range"] = (-1.0, 3.0)
    return RerankVerifier(reranker), graph


def _predict(verifier: RerankVerifier, cached: list[str], at_least: float | None = None) -> np.ndarray:
    queries = [ASKED] * len(cached)
    return verifier.predict(queries, cached, _vecs(queries), _vecs(cached), at_least=at_least)


def test_a_pairs_score_is_the_same_whatever_is_scored_with_it(
    fake: tuple[RerankVerifier, BatchScaledGraph],
) -> None:
    verifier, graph = fake
    alone = {c: float(_predict(verifier, [c])[0]) for c in CANDIDATES}
    assert graph.rows == [1] * len(CANDIDATES)
    rng = np.random.default_rng(5)
    for _ in range(20):
        cached = list(rng.choice(CANDIDATES, size=int(rng.integers(2, len(CANDIDATES) + 1)), replace=False))
        probs = _predict(verifier, cached)
        assert probs.tolist() == [alone[c] for c in cached]  # bit for bit
    assert set(graph.rows) == {1}, "every graph run scores one pair, unpadded"


def test_the_shortcut_skips_each_pair_that_cannot_pass(fake: tuple[RerankVerifier, BatchScaledGraph]) -> None:
    """A pair whose best possible score is below the threshold costs no graph run and scores 0.0;
    the others score exactly what they score alone."""
    verifier, graph = fake
    threshold = verifier.threshold
    alone = {c: float(_predict(verifier, [c])[0]) for c in CANDIDATES}
    passable = {c for c in CANDIDATES if _predict(verifier, [c], threshold)[0] > 0}
    graph.rows.clear()
    assert 0 < len(passable) < len(CANDIDATES)  # the set mixes both kinds
    probs = _predict(verifier, CANDIDATES, threshold)
    assert graph.rows == [1] * len(passable)
    assert probs.tolist() == [alone[c] if c in passable else 0.0 for c in CANDIDATES]
    assert all(alone[c] < threshold for c in CANDIDATES if c not in passable)


def test_batched_scoring_is_kept_as_an_option(fake: tuple[RerankVerifier, BatchScaledGraph]) -> None:
    """``batch_size`` > 1 scores a lookup's candidates in one run (and then they move together)."""
    verifier, graph = fake
    verifier.batch_size = 64
    batched = _predict(verifier, CANDIDATES)
    assert graph.rows == [len(CANDIDATES)]
    verifier.batch_size = 1
    assert _predict(verifier, CANDIDATES).tolist() != batched.tolist()


# ---------------------------------------------------------------------- real: the shipped models


def _qqp_groups(shared_data: Path, n: int) -> list[tuple[str, list[str]]]:
    """``n`` lookups of real QQP text: the ``text_b`` of a pair, with its ``text_a`` and the
    ``text_a`` of 4 pairs of other lengths as candidates (other topics, as unrelated entries)."""
    with open(shared_data / "paraphrase" / "qqp_pairs.jsonl") as fh:
        rows = [json.loads(line) for _, line in zip(range(5 * n + 50), fh, strict=False)]
    out = []
    for i in range(n):
        others = [rows[(i * 7 + k * 13 + 1) % len(rows)]["text_a"] for k in range(4)]
        out.append((rows[i]["text_b"], [rows[i]["text_a"], *others]))
    return out


@pytest.mark.real
def test_real_reranker_scores_a_pair_as_alone_whatever_its_neighbours(shared_data: Path) -> None:
    """The shipped int8 reranker and stack on 40 QQP lookups of 5 candidates: each candidate's
    probability and decision with its neighbours, in either order or with some of them, equal
    those of the pair scored alone, bit for bit."""
    from hybridllm.cache import get_embedder
    from hybridllm.cache.reranker import get_rerank_verifier

    embedder, verifier = get_embedder(), get_rerank_verifier()
    for query, cached in _qqp_groups(shared_data, 40):
        q_vec = embedder.embed_one(query)
        c_vecs = np.stack([embedder.embed_one(c) for c in cached])

        def probs(rows: list[int], q_vec: np.ndarray = q_vec, c_vecs: np.ndarray = c_vecs,
                  query: str = query, cached: list[str] = cached) -> list[float]:
            q = np.broadcast_to(q_vec, (len(rows), len(q_vec)))
            return verifier.predict([query] * len(rows), [cached[r] for r in rows], q, c_vecs[rows]).tolist()

        alone = [probs([r])[0] for r in range(len(cached))]
        for rows in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [0, 2], [3, 0]):
            together = probs(rows)
            assert together == [alone[r] for r in rows], (query, [cached[r] for r in rows])
            decided = [p >= verifier.threshold for p in together]
            assert decided == [alone[r] >= verifier.threshold for r in rows]


@pytest.mark.real
def test_real_hit_does_not_depend_on_unrelated_cached_entries(tmp_path: Path) -> None:
    """The same paraphrase asked of a cache holding its question alone and of one also holding
    near neighbours: served with the same probability, to the bit."""
    from hybridllm.cache import get_embedder
    from hybridllm.cache.reranker import get_rerank_verifier

    embedder, verifier = get_embedder(), get_rerank_verifier()
    neighbours = [
        "How can I improve my English writing skills?",
        "How can I improve my English vocabulary?",
        "How do I improve my French speaking skills?",
        "What is the best way to improve my communication skills?",
    ]
    seen = []
    for name, entries in (("alone", [CANDIDATES[0]]), ("crowded", [CANDIDATES[0], *neighbours])):
        cache = SemanticCache(tmp_path / f"{name}.sqlite3", embedder=embedder, verifier=verifier, ttl_s=None)
        for question in entries:
            cache.put(user(question), "answer: " + question, **KW)
        hit = cache.get(user(ASKED), **KW)
        cache.close()
        assert hit is not None and hit.cached_query == CANDIDATES[0]
        seen.append(hit.verifier_prob)
    assert seen[0] == seen[1]
