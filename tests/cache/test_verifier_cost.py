"""A lookup's verifier and length checks do each piece of work once, and score what they scored.

Before: ``RerankVerifier.predict`` tokenized every (query, cached) pair twice (for the logits, then
for the length check), ``SemanticCache.get`` tokenized a long query again after ``embed_query``
had, and ``OnnxEncoder.fits`` called the tokenizer even with nothing to tokenize.

The fast tests run the real MiniLM tokenizer with a stand-in for the ONNX graph; the real ones the
shipped embedder and reranker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridllm.cache import SemanticCache
from hybridllm.cache import encoder as encoder_module
from hybridllm.cache.embedder import DIM, Embedder
from hybridllm.cache.encoder import OnnxEncoder
from hybridllm.cache.reranker import MAX_TOKENS, Reranker, RerankVerifier, _sigmoid, read_info

KW = {"model": "m", "params_key": {"temperature": 0}}
REPORT = "Here is our quarterly report on revenue, costs and hiring in every region of the company. "
PAIRS = [  # (query, cached): short, long, one past what the reranker reads together
    ("How do I learn Python?", "How can I learn Python fast?"),
    ("What is the capital of France?", "What is the capital of Peru?"),
    (REPORT + "Who wrote it?", REPORT + "Who signed it?"),
    ("Why is the sky blue?", "Why is the sky blue during the day but red at sunset?"),
    (REPORT * 4 + "Who wrote it?", REPORT * 4 + "Who approved it?"),
]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


class FakeGraph:
    """Stands in for the ONNX session: a deterministic function of the token ids. One output per
    row: a logit (``width`` 1, the reranker; it moves with the batch's size and padded width, as
    the int8 graph's rounding does) or a unit vector (the embedder)."""

    def __init__(self, width: int) -> None:
        self.width = width

    def run(self, _names: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        if self.width == 1:
            logit = (ids * mask).sum(axis=1, keepdims=True) % 97 / 10.0 - 4.0 + ids.size / 1000.0
            return [logit.astype(np.float32)]
        out = np.zeros((len(ids), self.width), dtype=np.float32)
        for row, (r_ids, r_mask) in enumerate(zip(ids, mask, strict=True)):
            np.add.at(out[row], r_ids[r_mask == 1] % self.width, 1.0)
        return [out / np.linalg.norm(out, axis=1, keepdims=True)]


class CountingTokenizer:
    """The real tokenizer, keeping every input it was asked to encode."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.inputs: list[Any] = []
        self.calls = 0

    def encode_batch(self, inputs: list[Any], *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        self.inputs.extend(inputs)
        return self.real.encode_batch(inputs, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _fake_backed(cls: type[OnnxEncoder], folder: Path, max_tokens: int, width: int, mp: pytest.MonkeyPatch):
    """``cls`` on the real tokenizer of ``folder`` and a :class:`FakeGraph`, its tokenizer counted."""
    mp.setattr(encoder_module, "cpu_session", lambda _ort, _path, _threads: FakeGraph(width))
    model = cls.__new__(cls)
    OnnxEncoder.__init__(model, folder, quantized=True, num_threads=None, max_tokens=max_tokens)
    model._tokenizer = CountingTokenizer(model._tokenizer)
    return model


@pytest.fixture
def fake_reranker(minilm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Reranker:
    reranker = _fake_backed(Reranker, minilm_dir, MAX_TOKENS, 1, monkeypatch)
    reranker.info = read_info()
    return reranker


@pytest.fixture
def fake_embedder(minilm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Embedder:
    return _fake_backed(Embedder, minilm_dir, 256, DIM, monkeypatch)


def _vectors(n: int) -> np.ndarray:
    vecs = np.ones((n, DIM), dtype=np.float32)
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def _old_predict(
    verifier: RerankVerifier, queries: list[str], cached: list[str], q_vecs: np.ndarray, c_vecs: np.ndarray
) -> np.ndarray:
    """What ``predict`` computed before, from the reranker's public parts: the graph on each
    batch (as ``logits`` ordered and cut it), the stack, then ``fits_pairs`` tokenizing again."""
    from hybridllm.cache.features import pair_features
    from hybridllm.cache.reranker import stack_inputs

    reranker = verifier.reranker
    order = sorted(range(len(queries)), key=lambda i: len(queries[i]) + len(cached[i]))
    logits = np.empty(len(queries), dtype=np.float32)
    logits[order] = reranker.run([(queries[i], cached[i]) for i in order]).reshape(-1)
    out = logits.astype(np.float64)
    if verifier.stack is not None and verifier.features is not None:
        features = pair_features(queries, cached, q_vecs, c_vecs, verifier.features.idf)
        out = verifier.stack.logit(stack_inputs(out, features, verifier.features))
    whole = reranker.fits_pairs(list(zip(queries, cached, strict=True)))
    return np.where(whole, _sigmoid(out), 0.0)


# ---------------------------------------------------------------------- fast: real tokenizer, fake graph


def test_each_verified_pair_is_tokenized_once(fake_reranker: Reranker) -> None:
    verifier = RerankVerifier(fake_reranker, batch_size=64)  # one batch, as _old_predict runs it
    queries, cached = [q for q, _ in PAIRS], [c for _, c in PAIRS]
    vecs = _vectors(len(PAIRS))
    expected = _old_predict(verifier, queries, cached, vecs, vecs)
    tokenizer = fake_reranker._tokenizer
    tokenizer.inputs.clear()
    probs = verifier.predict(queries, cached, vecs, vecs)
    assert sorted(tokenizer.inputs) == sorted(PAIRS), "each pair once, for the logits and the length"
    # to the last bits: the stack and the trees now add up each pair's row on its own
    np.testing.assert_allclose(probs, expected, rtol=0, atol=1e-12)
    assert probs[-1] == 0.0 and (probs[:-1] > 0.0).all()  # only the pair read in part is refused


def test_logits_and_fits_keep_the_batches(fake_reranker: Reranker) -> None:
    """More pairs than a batch: the logits are those of the same batches as before, and the
    length check answers for each pair in the caller's order."""
    queries = [f"{q} ({i})" for i in range(7) for q, _ in PAIRS]
    cached = [c for _ in range(7) for _, c in PAIRS]
    logits, whole = fake_reranker.logits_and_fits(queries, cached, batch_size=4)
    order = sorted(range(len(queries)), key=lambda i: len(queries[i]) + len(cached[i]))
    expected = np.empty(len(queries), dtype=np.float32)
    for start in range(0, len(order), 4):
        idx = order[start : start + 4]
        expected[idx] = fake_reranker.run([(queries[i], cached[i]) for i in idx]).reshape(-1)
    np.testing.assert_array_equal(logits, expected)
    np.testing.assert_array_equal(whole, fake_reranker.fits_pairs(list(zip(queries, cached, strict=True))))
    assert not whole.all() and whole.any()


def test_length_checks_with_nothing_to_tokenize_do_not_call_the_tokenizer(fake_reranker: Reranker) -> None:
    tokenizer = fake_reranker._tokenizer
    assert fake_reranker.fits("How do I learn Python?", "Why is the sky blue?")  # short: always read whole
    assert fake_reranker.fits()
    assert fake_reranker.fits_pairs([]).shape == (0,)
    assert fake_reranker.logits_and_fits([], [])[0].shape == (0,)
    assert tokenizer.calls == 0
    assert not fake_reranker.fits("short", REPORT * 8)  # a long one is still measured
    assert tokenizer.calls == 1


def test_a_long_query_is_not_tokenized_again_after_embedding(tmp_path: Path, fake_embedder: Embedder) -> None:
    """The pipeline's order: embed_query, then get with that vector. The length check on the query
    reads what embedding it found; a question past the embedder's window is still refused."""
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, min_similarity=0.5, embedder=fake_embedder)
    cached = REPORT + "Who wrote the report for the northern region?"
    cache.put(user(cached), "Ada", **KW)
    tokenizer = fake_embedder._tokenizer
    for asked, served in ((REPORT + "Who wrote the report for the north region?", "Ada"),
                          (REPORT * 20 + "Who wrote it?", None)):  # past 256 tokens: exact repeats only
        vec = cache.embed_query(user(asked))
        tokenizer.inputs.clear()
        hit = cache.get(user(asked), embedding=vec, exact_checked=True, **KW)
        assert (hit.text if hit else None) == served
        assert asked not in tokenizer.inputs, "the query was tokenized again for its length"
    cache.close()


def test_the_length_memo_is_bounded_and_answers_as_the_tokenizer(fake_embedder: Embedder) -> None:
    texts = [f"{REPORT * (1 + 8 * (i % 3))} Question {i}?" for i in range(3 * encoder_module.FIT_MEMO_SIZE)]
    truth = [not fake_embedder._tokenizer.real.encode(t).overflowing for t in texts]
    assert not all(truth) and any(truth)
    for text in texts:
        fake_embedder.embed_one(text)
    assert len(fake_embedder._fit_memo) == encoder_module.FIT_MEMO_SIZE
    fake_embedder._tokenizer.inputs.clear()
    assert [fake_embedder.fits(t) for t in texts] == truth
    # the latest long texts run are answered from memory, older ones tokenized (short ones never)
    longer = [t for t in texts if len(t) > fake_embedder._always_fits]
    assert fake_embedder._tokenizer.inputs == longer[: -encoder_module.FIT_MEMO_SIZE]


# ---------------------------------------------------------------------- real: the shipped models


def _qqp_pairs(shared_data: Path, n: int) -> Iterator[tuple[str, str]]:
    with open(shared_data / "paraphrase" / "qqp_pairs.jsonl") as fh:
        for _, line in zip(range(n), fh, strict=False):
            row = json.loads(line)
            yield row["text_b"], row["text_a"]


@pytest.mark.real
def test_real_probabilities_are_unchanged(shared_data: Path) -> None:
    """The shipped reranker's probabilities on QQP pairs and long ones, five at a time as a lookup
    scores its candidates in one batch: what the two-pass computation gave (to the last bits: the
    stack and the trees now add up each pair's row on its own)."""
    from hybridllm.cache import get_embedder
    from hybridllm.cache.reranker import get_rerank_verifier

    verifier = RerankVerifier(get_rerank_verifier().reranker, batch_size=64)  # as _old_predict
    embedder = get_embedder()
    pairs = list(_qqp_pairs(shared_data, 195)) + PAIRS
    queries, cached = [q for q, _ in pairs], [c for _, c in pairs]
    q_vecs, c_vecs = embedder.embed(queries), embedder.embed(cached)
    for start in range(0, len(pairs), 5):
        part = slice(start, start + 5)
        new = verifier.predict(queries[part], cached[part], q_vecs[part], c_vecs[part])
        old = _old_predict(verifier, queries[part], cached[part], q_vecs[part], c_vecs[part])
        np.testing.assert_allclose(new, old, rtol=0, atol=1e-12)
    assert verifier.kind == "reranker"


@pytest.mark.real
def test_real_lookup_tokenizes_the_query_once_and_each_pair_once(tmp_path: Path, shared_data: Path) -> None:
    from hybridllm.cache import get_embedder
    from hybridllm.cache.reranker import get_rerank_verifier

    embedder = get_embedder()
    reranker = get_rerank_verifier().reranker
    pairs = list(_qqp_pairs(shared_data, 200))
    cache = SemanticCache(tmp_path / "r.sqlite3", embedder=embedder)
    for _, question in pairs:
        cache.put(user(question), "answer: " + question, **KW)
    # a long question (its length is checked, not assumed) close to a cached one: scored
    near = next(c for _, c in pairs if len(c) > embedder._always_fits and not any(map(str.isdigit, c)))
    asked = "Tell me, " + near
    counters = CountingTokenizer(embedder._tokenizer), CountingTokenizer(reranker._tokenizer)
    embedder._tokenizer, reranker._tokenizer = counters
    try:
        vec = cache.embed_query(user(asked))
        assert cache.get_exact(user(asked), **KW) is None
        cache.get(user(asked), embedding=vec, exact_checked=True, **KW)
    finally:
        embedder._tokenizer, reranker._tokenizer = counters[0].real, counters[1].real
        cache.close()
    assert counters[0].inputs.count(asked) == 1  # embedding; its length check read that
    scored = [p for p in counters[1].inputs if p[0] == asked]
    assert scored, "the lookup scored no candidate: pick a query with neighbours"
    assert len(scored) == len(set(scored)), "a pair was tokenized twice"
    assert counters[1].calls == 1
