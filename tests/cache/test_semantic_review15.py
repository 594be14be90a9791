"""Review 15 of the cache at run time: max_entries on open, top_k slots of skipped candidates."""

from __future__ import annotations

import sqlite3
import types
from pathlib import Path

import numpy as np
import pytest

from hybridllm.cache import SemanticCache, _candidates, _mirror, _writes
from hybridllm.cache import semantic as semantic_mod

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}


def _msgs(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _vec(cos: float, other: int) -> np.ndarray:
    """A unit vector at cosine ``cos`` to the first axis, leaning on axis ``other``."""
    vec = np.zeros(384, dtype=np.float32)
    vec[0], vec[other] = cos, np.sqrt(1.0 - cos * cos)
    return vec


QUERY_VEC = _vec(1.0, 1)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The cache module's clock, set by the test (the time module itself is left alone)."""
    now = [1_000_000.0]
    for mod in (semantic_mod, _mirror, _writes):  # the cache's modules that read the clock
        monkeypatch.setattr(mod, "time", types.SimpleNamespace(time=lambda: now[0]))
    return now


def test_reopening_with_a_smaller_max_entries_evicts_on_open(tmp_path: Path, clock: list[float]) -> None:
    """Before: a file of 6 entries opened with max_entries=3 served all 6 (and stats said 6)
    until the next put. Now the 3 least recently used go on open; the file stays."""
    path = tmp_path / "c.sqlite3"
    questions = [f"question number {i} about topic{i}" for i in range(6)]
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder(), max_entries=10) as cache:
        for i, q in enumerate(questions):
            clock[0] += 1
            cache.put(_msgs(q), f"answer {i}", **KW)
        clock[0] += 1
        assert cache.get(_msgs(questions[0]), **KW) is not None  # 0 is now the most recent
    clock[0] += 1
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder(), max_entries=3) as cache:
        assert cache.stats()["entries"] == 3
        served = [i for i, q in enumerate(questions) if cache.get(_msgs(q), **KW) is not None]
        assert served == [0, 4, 5]
    with sqlite3.connect(path) as conn:  # evicted in the file too, not only in memory
        assert conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 3


def test_expired_candidates_do_not_take_the_top_k_slots(tmp_path: Path, clock: list[float]) -> None:
    """Before: with top_k=2, two expired entries nearer the question took both slots and the live
    entry ranked third, close enough, was a miss."""
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, ttl_s=1000.0, top_k=2,
                          min_similarity=0.9, embedder=FakeEmbedder())
    cache.put(_msgs("stale one"), "old 1", embedding=_vec(0.99, 2), **KW)
    cache.put(_msgs("stale two"), "old 2", embedding=_vec(0.98, 3), **KW)
    clock[0] += 900
    cache.put(_msgs("fresh"), "new", embedding=_vec(0.95, 4), **KW)
    clock[0] += 200  # the first two expired, the third is live
    hit = cache.get(_msgs("the question"), embedding=QUERY_VEC, **KW)
    assert hit is not None and hit.text == "new"
    assert hit.similarity == pytest.approx(0.95, abs=1e-5)
    cache.close()


def test_refused_candidates_do_not_take_the_top_k_slots(tmp_path: Path) -> None:
    """Before: with top_k=2, two nearer questions about other years (refused by the guards) took
    both slots, and the same question reworded, ranked third, was a miss."""
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, top_k=2, min_similarity=0.9,
                          embedder=FakeEmbedder())
    cache.put(_msgs("What was the population of Paris in 1901?"), "a", embedding=_vec(0.99, 2), **KW)
    cache.put(_msgs("What was the population of Paris in 1905?"), "b", embedding=_vec(0.98, 3), **KW)
    cache.put(_msgs("Roughly what was the population of Paris in 2020?"), "c",
              embedding=_vec(0.95, 4), **KW)
    hit = cache.get(_msgs("What was the population of Paris in 2020?"), embedding=QUERY_VEC, **KW)
    assert hit is not None and hit.text == "c"
    cache.close()


def test_the_widened_search_is_bounded_and_still_refuses_below_min_similarity(tmp_path: Path) -> None:
    """Many refused candidates: the lookup ranks at most _MAX_SCANNED rows, in two searches, and
    misses; one below min_similarity is never served however many are skipped."""
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, top_k=2, min_similarity=0.9,
                          embedder=FakeEmbedder())
    n = _candidates._MAX_SCANNED + 10
    for i in range(n):  # all nearer than the live one, all about another year
        cache.put(_msgs(f"What was the population of Paris in {1000 + i}?"), "x",
                  embedding=_vec(0.999 - i * 1e-4, 2 + i), **KW)
    cache.put(_msgs("Roughly what was the population of Paris in 2020?"), "c",
              embedding=_vec(0.95, 300), **KW)
    cache.put(_msgs("Population of Paris in 2020, please?"), "far", embedding=_vec(0.5, 301), **KW)
    calls = []
    search = cache._index.search
    cache._index.search = lambda *a, **k: calls.append(a[2]) or search(*a, **k)
    assert cache.get(_msgs("What was the population of Paris in 2020?"), embedding=QUERY_VEC, **KW) is None
    assert calls == [2, _candidates._MAX_SCANNED]  # one wider search, not one per skipped row
    cache.close()


@pytest.mark.parametrize("embedding", [["a"] * 384, "not a vector", {"x": 1}])
def test_an_embedding_that_is_not_numbers_is_an_invalid_request(tmp_path: Path, embedding: object) -> None:
    """Before: a bare numpy ValueError or TypeError; now InvalidRequestError, nothing stored."""
    from hybridllm._exceptions import InvalidRequestError

    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder())
    cache.put(_msgs("hello there"), "hi", **KW)
    with pytest.raises(InvalidRequestError, match="vector of numbers"):
        cache.get(_msgs("hello friend"), embedding=embedding, **KW)
    with pytest.raises(InvalidRequestError, match="vector of numbers"):
        cache.put(_msgs("hello friend"), "x", embedding=embedding, **KW)
    assert cache.stats()["entries"] == 1
    cache.close()


def test_a_closed_cache_says_so(tmp_path: Path) -> None:
    """Before: sqlite3.ProgrammingError ("Cannot operate on a closed database") from every call
    after close(); now CacheError naming the file, and close() may be called again."""
    from hybridllm._exceptions import CacheError

    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder())
    cache.put(_msgs("hello there"), "hi", **KW)
    cache.close()
    cache.close()
    calls = [
        lambda: cache.get(_msgs("hello there"), **KW),
        lambda: cache.get(_msgs("in no bucket"), model="other", params_key={}, exact_checked=True),
        lambda: cache.get_exact(_msgs("hello there"), **KW),
        lambda: cache.put(_msgs("hello again"), "x", **KW),
        lambda: cache.delete("x"),
        lambda: cache.clear(),
        cache.stats,
    ]
    for call in calls:
        with pytest.raises(CacheError, match="is closed"):
            call()
    with SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder()) as again:
        assert again.get(_msgs("hello there"), **KW).text == "hi"  # the file is intact


def test_past_the_refused_ones_a_question_below_min_similarity_is_still_a_miss(tmp_path: Path) -> None:
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, top_k=2, min_similarity=0.9,
                          embedder=FakeEmbedder())
    for i in range(5):
        cache.put(_msgs(f"What was the population of Paris in {1900 + i}?"), "x",
                  embedding=_vec(0.99 - i * 1e-3, 2 + i), **KW)
    cache.put(_msgs("Roughly what was the population of Paris in 2020?"), "far",
              embedding=_vec(0.85, 300), **KW)
    assert cache.get(_msgs("What was the population of Paris in 2020?"), embedding=QUERY_VEC, **KW) is None
    assert cache.stats()["misses"] == 1
    cache.close()


@pytest.mark.parametrize("entry_id", [None, ["a", "b"], 3])
def test_delete_of_an_id_that_is_not_a_string_is_an_invalid_request(tmp_path: Path, entry_id: object) -> None:
    """Before: None and a list raised CacheError ("Writing the cache ... failed: NOT NULL
    constraint failed"), as if the file were at fault; 3 deleted nothing silently."""
    from hybridllm._exceptions import InvalidRequestError

    with SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder()) as cache:
        cache.put(_msgs("hello there"), "hi", **KW)
        with pytest.raises(InvalidRequestError, match="entry_id must be a string"):
            cache.delete(entry_id)
        assert cache.stats()["entries"] == 1
