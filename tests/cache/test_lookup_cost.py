"""A lookup skips the reranker graph when no candidate can reach the threshold, deciding as before.

Before: every candidate above the cosine prefilter went through the reranker graph (about 60% of a
lookup at 10,000 entries), even when the stack's other inputs (the feature verifier's logit and the
surface features) held its score below the threshold whatever logit the graph could give. The
graph's logit range is read off its last LayerNorm and head (:mod:`hybridllm.cache.logit_bound`).
These tests score in batches (``batch_size=64``): when one candidate can reach it, the whole batch
runs. The default is now one pair per run, where each run is skipped on its own
(``test_batch_invariance``).

Also: ``pair_features`` parsed the query once per candidate.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridllm.cache import SemanticCache
from hybridllm.cache import encoder as encoder_module
from hybridllm.cache import features as features_module
from hybridllm.cache.encoder import OnnxEncoder
from hybridllm.cache.features import handcrafted, pair_features
from hybridllm.cache.logit_bound import graph_logit_range, logit_range
from hybridllm.cache.reranker import MAX_TOKENS, Reranker, RerankVerifier, read_info

from .fakes import FakeEmbedder

KW: dict[str, Any] = {"model": "m", "params_key": {"temperature": 0}}
ASKED = "How can I improve my English speaking skills?"
CANDIDATES = [  # near the question, or not at all
    "How do I improve my spoken English?",
    "How can I improve my English speaking skill?",
    "What is the best way to cook rice in a pot?",
    "Why do cats sleep so much during the day?",
    "Which countries have the largest oil reserves?",
]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# ---------------------------------------------------------------------- the logit range of a graph


def _tiny_config(hidden: int = 16) -> dict:
    return {
        "hidden_size": hidden, "num_attention_heads": 2 if hidden % 2 == 0 and hidden > 2 else 1,
        "num_hidden_layers": 2, "intermediate_size": 2 * hidden, "vocab_size": 40,
        "max_position_embeddings": 32, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
    }


def _tiny_weights(cfg: dict, rng: np.random.Generator, *, scale: float) -> dict[str, np.ndarray]:
    """Random cross-encoder weights; ``scale`` large makes LayerNorm gains and the head large."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    w: dict[str, np.ndarray] = {
        "encoder.word.weight": rng.normal(size=(cfg["vocab_size"], h)),
        "encoder.position.weight": rng.normal(size=(cfg["max_position_embeddings"], h)),
        "encoder.token_type.weight": rng.normal(size=(cfg["type_vocab_size"], h)),
        "encoder.emb_norm.weight": rng.normal(size=h), "encoder.emb_norm.bias": rng.normal(size=h),
        "head.weight": rng.normal(size=(1, h)) * scale, "head.bias": rng.normal(size=1),
    }
    shapes = {"query": (h, h), "key": (h, h), "value": (h, h), "attn_out": (h, h), "up": (inter, h),
              "down": (h, inter)}
    for i in range(cfg["num_hidden_layers"]):
        for name, shape in shapes.items():
            w[f"encoder.layers.{i}.{name}.weight"] = rng.normal(size=shape) * scale
            w[f"encoder.layers.{i}.{name}.bias"] = rng.normal(size=shape[0])
        for norm in ("attn_norm", "out_norm"):
            w[f"encoder.layers.{i}.{norm}.weight"] = rng.normal(size=h) * scale
            w[f"encoder.layers.{i}.{norm}.bias"] = rng.normal(size=h)
    return {k: v.astype(np.float32) for k, v in w.items()}


@pytest.mark.parametrize(("hidden", "scale", "seed"), [(16, 0.3, 7), (16, 3.0, 7), (2, 1.0, 1)])
def test_the_logit_range_holds_for_every_input_fp32_and_int8(
    tmp_path: Path, hidden: int, scale: float, seed: int
) -> None:
    """Random graphs, fp32 and int8, on random batches (one to eight rows, padded): every logit
    lies in the range read off the graph. With large weights the logits spread to about a third of
    it (a range without the sqrt(n) factor would not hold them); with a hidden size of 2 a
    LayerNorm output is one of two points, so the range is all but reached, and the int8 head's
    rounding goes past what the LayerNorm alone allows (a range without it would not hold them)."""
    import onnx
    import onnxruntime as ort

    from hybridllm.cache.onnx_graph import cross_encoder
    from hybridllm.cache.prepare import quantize

    rng = np.random.default_rng(seed)
    cfg = _tiny_config(hidden)
    fp32, int8 = tmp_path / "model.onnx", tmp_path / "model.int8.onnx"
    onnx.save(cross_encoder(cfg, _tiny_weights(cfg, rng, scale=scale)), str(fp32))
    quantize(fp32, int8)
    for path in (fp32, int8):
        found = logit_range(path)
        assert found is not None
        low, high = found
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        seen = []
        for _ in range(300):
            rows, width = int(rng.integers(1, 9)), int(rng.integers(2, cfg["max_position_embeddings"] + 1))
            lengths = rng.integers(1, width + 1, size=rows)
            mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
            ids = rng.integers(0, cfg["vocab_size"], size=(rows, width)) * mask
            types = rng.integers(0, 2, size=(rows, width)) * mask
            (out,) = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
            seen.extend(out.tolist())
        assert low <= min(seen) and max(seen) <= high, (path.name, low, high, min(seen), max(seen))
        assert max(seen) - min(seen) > 0.0
    assert logit_range(int8) != logit_range(fp32)  # the int8 head's rounding widens it


def test_a_graph_of_another_shape_has_no_range(tmp_path: Path) -> None:
    """The sentence embedder's graph (no head) and a file that is not a graph: None, so the
    verifier scores every pair."""
    from hybridllm.cache.onnx_graph import sentence_encoder

    cfg = _tiny_config()
    cross = _tiny_weights(cfg, np.random.default_rng(1), scale=1.0)
    weights = {k.removeprefix("encoder."): v for k, v in cross.items()}
    assert graph_logit_range(sentence_encoder(cfg, weights)) is None
    (tmp_path / "x.onnx").write_bytes(b"not a graph")
    assert logit_range(tmp_path / "x.onnx") is None


# ---------------------------------------------------------------------- lookups: real tokenizer, fake graph


class RangedGraph:
    """Stands in for the reranker session: a logit in [-1, 3] from the token ids (which also moves
    with the batch, as the int8 graph's does), and a count of runs."""

    def __init__(self) -> None:
        self.runs = 0

    def run(self, _names: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        self.runs += 1
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        raw = (ids * mask).sum(axis=1) % 89 / 89.0 + ids.size / 10000.0
        return [np.clip(4.0 * raw - 1.0, -1.0, 3.0).astype(np.float32)[:, None]]


@pytest.fixture
def ranged(minilm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[RerankVerifier, RangedGraph]:
    """The shipped stack and feature verifier over the real tokenizer and a graph whose logit
    range is known to be [-1, 3]."""
    graph = RangedGraph()
    monkeypatch.setattr(encoder_module, "cpu_session", lambda _ort, _path, _threads: graph)
    reranker = Reranker.__new__(Reranker)
    OnnxEncoder.__init__(reranker, minilm_dir, quantized=True, num_threads=None, max_tokens=MAX_TOKENS)
    reranker.info = read_info()
    reranker.__dict__["logit_range"] = (-1.0, 3.0)
    # one batch per lookup: these tests count graph runs of batched scoring (per-pair scoring, the
    # default, is in test_batch_invariance.py)
    verifier = RerankVerifier(reranker, batch_size=64)
    assert verifier.stack is not None
    return verifier, graph


def _vecs(texts: list[str]) -> np.ndarray:
    return np.stack([FakeEmbedder().embed_one(t) for t in texts])


def test_no_candidate_can_pass_so_the_graph_is_not_run(ranged: tuple[RerankVerifier, RangedGraph]) -> None:
    verifier, graph = ranged
    far = CANDIDATES[2:]
    q_vecs, c_vecs = _vecs([ASKED] * len(far)), _vecs(far)
    probs = verifier.predict([ASKED] * len(far), far, q_vecs, c_vecs, at_least=verifier.threshold)
    assert graph.runs == 0
    np.testing.assert_array_equal(probs, np.zeros(len(far)))
    scored = verifier.predict([ASKED] * len(far), far, q_vecs, c_vecs)  # what they really score
    assert graph.runs == 1
    assert (scored < verifier.threshold).all() and (scored > 0).all()


def test_one_candidate_can_pass_so_every_pair_is_scored_as_before(
    ranged: tuple[RerankVerifier, RangedGraph],
) -> None:
    verifier, graph = ranged
    q_vecs, c_vecs = _vecs([ASKED] * len(CANDIDATES)), _vecs(CANDIDATES)
    queries = [ASKED] * len(CANDIDATES)
    shortcut = verifier.predict(queries, CANDIDATES, q_vecs, c_vecs, at_least=verifier.threshold)
    assert graph.runs == 1
    every = verifier.predict(queries, CANDIDATES, q_vecs, c_vecs)
    np.testing.assert_array_equal(shortcut, every)  # the same batch: bit for bit
    assert (every[2:] > 0).all()  # the hopeless ones were scored too, in the same batch


def test_decisions_over_many_candidate_sets_are_unchanged(ranged: tuple[RerankVerifier, RangedGraph]) -> None:
    verifier, graph = ranged
    rng = np.random.default_rng(3)
    pool = CANDIDATES + ["How do I speak English fluently?", "How can I improve my English?",
                         "Ways to improve English speaking skills?", "How can I learn to speak English well?"]
    skipped = 0
    for _ in range(60):
        cached = list(rng.choice(pool, size=int(rng.integers(1, 6)), replace=False))
        queries = [ASKED] * len(cached)
        q_vecs, c_vecs = _vecs(queries), _vecs(cached)
        runs = graph.runs
        shortcut = verifier.predict(queries, cached, q_vecs, c_vecs, at_least=verifier.threshold)
        skipped += graph.runs == runs
        every = verifier.predict(queries, cached, q_vecs, c_vecs)
        assert (shortcut >= verifier.threshold).tolist() == (every >= verifier.threshold).tolist()
        if graph.runs == runs + 2:
            np.testing.assert_array_equal(shortcut, every)
    assert 0 < skipped < 60


def test_the_cache_asks_for_its_threshold(tmp_path: Path, ranged: tuple[RerankVerifier, RangedGraph]) -> None:
    """A miss whose candidates cannot pass costs no graph run; a paraphrase is still served."""
    verifier, graph = ranged
    path = tmp_path / "c.sqlite3"
    cache = SemanticCache(path, verifier=verifier, min_similarity=0.0, embedder=FakeEmbedder())  # type: ignore[arg-type]
    for question in CANDIDATES[2:]:
        cache.put(user(question), "answer: " + question, **KW)
    assert cache.get(user(ASKED), **KW) is None
    assert graph.runs == 0
    cache.put(user(CANDIDATES[0]), "Practice daily.", **KW)
    hit = cache.get(user(ASKED), **KW)
    assert graph.runs == 1
    if hit is not None:  # the fake graph decides; what matters is that it ran
        assert hit.text == "Practice daily."
    cache.close()


# ---------------------------------------------------------------------- features


def test_pair_features_parse_each_text_once(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[str] = []
    real = features_module._Parsed

    class Counting(real):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def __init__(self, text: str) -> None:
            parsed.append(text)
            super().__init__(text)

    queries = [ASKED] * len(CANDIDATES)
    q_vecs, c_vecs = _vecs(queries), _vecs(CANDIDATES)
    expected = np.array([handcrafted(q, c, float(qv @ cv)) for q, c, qv, cv in
                         zip(queries, CANDIDATES, q_vecs, c_vecs, strict=True)], dtype=np.float32)
    monkeypatch.setattr(features_module, "_Parsed", Counting)
    x = pair_features(queries, CANDIDATES, q_vecs, c_vecs)
    assert parsed.count(ASKED) == 1, "the query was parsed once per candidate"
    assert sorted(parsed) == sorted([ASKED, *CANDIDATES])
    np.testing.assert_array_equal(x[:, : expected.shape[1]], expected)


# ---------------------------------------------------------------------- real: the shipped models


def _qqp(shared_data: Path, n: int) -> list[dict]:
    with open(shared_data / "paraphrase" / "qqp_pairs.jsonl") as fh:
        return [json.loads(line) for _, line in zip(range(n), fh, strict=False)]


@pytest.mark.real
def test_real_reranker_logits_lie_in_its_range(shared_data: Path) -> None:
    from hybridllm.cache.reranker import get_rerank_verifier

    reranker = get_rerank_verifier().reranker
    assert reranker.logit_range is not None
    low, high = reranker.logit_range
    rows = _qqp(shared_data, 300)
    queries = [r["text_b"] for r in rows] + [r["text_a"] for r in rows[:50]]
    cached = [r["text_a"] for r in rows] + [r["text_a"] for r in rows[:50]]  # identical pairs too
    for size in (1, 5, 64):
        logits = reranker.logits(queries, cached, batch_size=size)
        assert low <= logits.min() and logits.max() <= high
    assert -20.0 < low < high < 20.0  # a range that can rule candidates out


@pytest.mark.real
def test_real_lookups_decide_as_without_the_shortcut(tmp_path: Path, shared_data: Path) -> None:
    """The shipped embedder and reranker over 400 cached QQP questions: the other question of 150
    pairs is served (or not) exactly as when every candidate is scored, some lookups skip the
    graph, and some hit."""
    from hybridllm.cache import get_embedder
    from hybridllm.cache.reranker import get_rerank_verifier

    rows = _qqp(shared_data, 400)
    embedder = get_embedder()
    verifier = get_rerank_verifier()
    cache = SemanticCache(tmp_path / "r.sqlite3", embedder=embedder, verifier=verifier, ttl_s=None)
    for row in rows:
        cache.put(user(row["text_a"]), "answer: " + row["text_a"], **KW)
    runs: list[int] = []  # graph runs per lookup
    verified: list[bool] = []  # per lookup: the verifier was asked
    run_batches, shortcut = verifier.reranker.run_batches, verifier.predict

    def counted(*args: Any, **kwargs: Any) -> Any:
        runs[-1] += 1
        return run_batches(*args, **kwargs)

    def every_pair(*args: Any, at_least: float | None = None) -> Any:
        verified[-1] = True
        return shortcut(*args)

    def with_shortcut(*args: Any, **kwargs: Any) -> Any:
        verified[-1] = True
        return shortcut(*args, **kwargs)

    verifier.reranker.run_batches = counted  # type: ignore[method-assign]
    served: dict[str, list[str | None]] = {"shortcut": [], "every": []}
    skipped = 0
    try:
        for row in rows[:150]:
            vec = cache.embed_query(user(row["text_b"]))
            for mode, predict in (("shortcut", with_shortcut), ("every", every_pair)):
                verifier.predict = predict  # type: ignore[method-assign, assignment]
                runs.append(0)
                verified.append(False)
                hit = cache.get(user(row["text_b"]), embedding=vec, **KW)
                served[mode].append(hit.text if hit else None)
                skipped += mode == "shortcut" and verified[-1] and runs[-1] == 0
    finally:
        verifier.__dict__.pop("predict", None)
        verifier.reranker.__dict__.pop("run_batches", None)
        cache.close()
    assert served["shortcut"] == served["every"]
    assert skipped > 0
    assert any(s is not None for s in served["shortcut"])
