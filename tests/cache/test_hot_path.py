"""The lookup hot path does each piece of work once: a cached question's length check (a tokenizer
pass for a long one) once per entry, and the exact-repeat check once per pipeline lookup."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hybridllm import HybridLLM
from hybridllm.backends.fake import FakeBackend
from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}
DOC = "Here is our quarterly report on revenue costs and hiring in every region."


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


class CountingFitsEmbedder(FakeEmbedder):
    """Reads its first ``window`` words, like MiniLM its first 256 tokens; counts each text that
    ``fits`` was asked about (the real embedder tokenizes a long one to answer)."""

    window = 20

    def __init__(self) -> None:
        super().__init__()
        self.asked: Counter[str] = Counter()

    def embed_one(self, text: str) -> np.ndarray:
        return super().embed_one(" ".join(text.split()[: self.window]))

    def fits(self, *texts: str) -> bool:
        self.asked.update(texts)
        return all(len(t.split()) <= self.window for t in texts)


def test_a_cached_question_is_measured_once_not_on_every_lookup(tmp_path: Path) -> None:
    emb = CountingFitsEmbedder()
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, min_similarity=0.5, embedder=emb)
    cached = ["How much did revenue grow last year?", "How much did revenue grow in the last quarter?"]
    for q in cached:
        cache.put(user(q), "answer: " + q, **KW)
    asks = ["How much did the revenue grow last year?", "how much did revenue grow last year, roughly?",
            "How much did revenue grow over the last year?"]
    served = [cache.get(user(q), **KW) for q in asks]
    assert all(hit is not None for hit in served)
    for q in cached:
        assert emb.asked[q] == 1, f"{q!r} was measured {emb.asked[q]} times in {len(asks)} lookups"
    cache.close()


def test_an_entry_rewritten_by_another_process_is_measured_again(tmp_path: Path) -> None:
    """The kept answer belongs to the entry as this process read it: a write by another process
    (seen through the store's change log) or a reload starts afresh, and what is served is the same
    as without the memo: a question longer than the embedder reads is matched only exactly."""
    path = tmp_path / "shared.sqlite3"
    emb = CountingFitsEmbedder()
    mine = SemanticCache(path, verifier=None, min_similarity=0.5, embedder=emb)
    other = SemanticCache(path, verifier=None, min_similarity=0.5, embedder=FakeEmbedder())
    short = "How much did revenue grow last year?"
    other.put(user(short), "ten percent", **KW)
    assert mine.get(user("How much did the revenue grow last year?"), **KW).text == "ten percent"
    assert emb.asked[short] == 1
    other.put(user(short), "eleven percent", **KW)  # the same entry, rewritten over there
    assert mine.get(user("How much did the revenue grow last year?"), **KW).text == "eleven percent"
    assert emb.asked[short] == 2
    long_q = DOC * 2 + " Who wrote it?"
    other.put(user(long_q), "Ada", **KW)  # added over there: longer than the embedder reads
    for _ in range(2):  # a question the embedder reads whole, near the long one's head
        assert mine.get(user(DOC + " Who signed it?"), **KW) is None
    assert emb.asked[long_q] == 1
    assert mine.get(user(long_q), **KW).text == "Ada"  # an exact repeat is served
    other.close()
    mine.close()


class StatementCounter:
    def __init__(self, cache: SemanticCache) -> None:
        self.statements: list[str] = []
        cache._store._conn.set_trace_callback(self.statements.append)

    def reads(self) -> int:
        return sum(s.lstrip().upper().startswith(("SELECT", "PRAGMA")) for s in self.statements)


def test_get_after_get_exact_skips_the_second_exact_check(tmp_path: Path) -> None:
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, min_similarity=0.5, embedder=FakeEmbedder())
    cache.put(user("How do I learn Python?"), "Practice daily.", **KW)
    counter = StatementCounter(cache)
    for checked in (False, True):
        counter.statements.clear()
        assert cache.get_exact(user("What is the capital of Peru?"), **KW) is None
        assert cache.get(user("What is the capital of Peru?"), exact_checked=checked, **KW) is None
        if checked:
            assert counter.reads() == 2  # one look at the change log per call
        else:
            assert counter.reads() == 3  # get looks again before its exact check
    # what is served does not change: a paraphrase still hits, an exact repeat still hits
    assert cache.get(user("How can I learn Python?"), exact_checked=True, **KW).text == "Practice daily."
    assert cache.get(user("How do I learn Python?"), exact_checked=True, **KW).text == "Practice daily."
    cache.close()


def test_the_pipeline_checks_the_exact_repeat_once_per_lookup(tmp_path: Path) -> None:
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, min_similarity=0.9, embedder=FakeEmbedder())
    calls = Counter()
    exact_hit = cache._exact_hit

    def counting(bucket: str, query: str, *rest):  # (rest: a structured request's answer check)
        calls[query] += 1
        return exact_hit(bucket, query, *rest)

    cache._exact_hit = counting  # type: ignore[method-assign]
    llm = HybridLLM(edge=FakeBackend(model="edge-model", reply=lambda m: "edge answer"), cache=cache)
    try:
        first = llm.chat("What is the capital of Peru?")
        assert first.route == "edge"
        assert calls["What is the capital of Peru?"] == 1  # a miss: get_exact, then get without it
        again = llm.chat("What is the capital of Peru?")
        assert (again.route, again.text) == ("cache", "edge answer")
        assert calls["What is the capital of Peru?"] == 2
    finally:
        llm.close()


@pytest.mark.real
def test_real_embedder_tokenizes_a_long_candidate_once(tmp_path: Path, minilm_dir: Path) -> None:
    """The MiniLM embedder: a cached question past its 256 tokens is tokenized on its first lookup
    as a candidate only, and is still served only on an exact repeat."""
    from hybridllm.cache.embedder import get_embedder

    emb = get_embedder()
    long_q = " ".join([DOC] * 30) + " Who wrote it?"
    assert not emb.fits(long_q)
    cache = SemanticCache(tmp_path / "r.sqlite3", verifier=None, min_similarity=0.2, embedder=emb)
    cache.put(user(long_q), "Ada", **KW)
    # as if another process had written the entry: this embedder has not just read the question
    # (it remembers the length of the texts it ran lately; see test_verifier_cost.py)
    emb._fit_memo.clear()
    tokenized: list[str] = []
    real = emb._tokenizer

    class Counting:
        def __getattr__(self, name: str):
            return getattr(real, name)

        def encode_batch(self, texts, *args, **kwargs):
            tokenized.extend(texts)
            return real.encode_batch(texts, *args, **kwargs)

    emb._tokenizer = Counting()
    try:
        # short questions about the report: the long one is among their nearest, and unread past
        # its head, so it is never served for them
        for ask in ("Who signed it?", "Who approved it?", "Who read it?"):
            msgs = user(f"{DOC} {ask}")
            vec = cache.embed_query(msgs)
            assert cache.get_exact(msgs, **KW) is None
            assert cache.get(msgs, embedding=vec, exact_checked=True, **KW) is None
        assert tokenized.count(long_q) == 1
        assert cache.get(user(long_q), **KW).text == "Ada"
    finally:
        emb._tokenizer = real
        cache.close()
