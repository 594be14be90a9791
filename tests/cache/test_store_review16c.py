"""Review 16c of the cache store: a failed eviction after a stored put, LRU ties on a coarse clock."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pytest

from hybridllm._exceptions import CacheError
from hybridllm.cache import SemanticCache, _mirror, _writes
from hybridllm.cache import semantic as semantic_mod
from hybridllm.cache.store import CacheStore, Entry

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}


def _msgs(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


class _FrozenTime:
    """The ``time`` module with a clock that does not move (a coarse clock: one tick for all)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_a_put_whose_eviction_fails_returns_the_stored_entry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The entry is committed, then the write that evicts past max_entries fails (a full disk):
    before, put raised CacheError although the answer was stored and served. Now put returns the
    id and logs the failed eviction; a later put evicts."""
    path = tmp_path / "c.sqlite3"
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder(), max_entries=1) as cache:
        cache.put(_msgs("how do I bake bread"), "knead", **KW)
        real_delete = cache._store.delete

        def full_disk(ids: list[str]) -> int:
            raise CacheError("Writing the cache failed: database or disk is full")

        cache._store.delete = full_disk
        with caplog.at_level(logging.WARNING, logger="hybridllm.cache"):
            eid = cache.put(_msgs("who painted the mona lisa"), "da vinci", **KW)
        assert eid is not None and cache._store.get(eid) is not None
        assert "evicting old entries from the cache failed" in caplog.text
        assert "disk is full" in caplog.text
        assert cache.get(_msgs("who painted the mona lisa"), **KW).text == "da vinci"
        cache._store.delete = real_delete
        cache.put(_msgs("what is the capital of france"), "paris", **KW)
        assert cache._store.count() == 1  # bounded again by the next put


def _entry(eid: str, when: float) -> Entry:
    vec = np.zeros(384, dtype=np.float32)
    vec[0] = 1.0
    return Entry(eid, "default", "b", f"question {eid}", "answer", vec, when, when, None)


def test_lru_ties_go_by_write_order_a_rewrite_included(tmp_path: Path) -> None:
    """Three writes in one clock tick, the first rewritten last: the least recently written is
    b. Before, ties fell in any order (here: a, whose rewrite kept its old row position)."""
    store = CacheStore(tmp_path / "c.sqlite3", dim=384)
    for eid in ("a", "b", "c", "a"):
        store.upsert(_entry(eid, 1000.0))
    assert store.lru_ids(3) == ["b", "c", "a"]
    assert store.get("a").query == "question a"  # still the one row, with its columns
    assert store.count() == 2 + 1
    store.close()


def test_the_answer_a_put_just_rewrote_is_not_evicted_on_a_coarse_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """max_entries=2, every write in one clock tick: a, b, a again (its answer replaced), then c.
    The least recently written is b; before, a (just rewritten) was evicted and its new answer
    lost."""
    clock = _FrozenTime(1_000_000.0)
    for mod in (semantic_mod, _mirror, _writes):  # the cache's modules that read the clock
        monkeypatch.setattr(mod, "time", clock)
    path = tmp_path / "c.sqlite3"
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder(), max_entries=2) as cache:
        cache.put(_msgs("how do I bake bread"), "knead", **KW)
        cache.put(_msgs("who painted the mona lisa"), "da vinci", **KW)
        cache.put(_msgs("how do I bake bread"), "knead, proof, bake", **KW)
        cache.put(_msgs("what is the capital of france"), "paris", **KW)
        assert cache.get(_msgs("how do I bake bread"), **KW).text == "knead, proof, bake"
        assert cache.get(_msgs("who painted the mona lisa"), **KW) is None


def test_the_latest_write_is_never_the_lru_victim_even_with_a_clock_set_back(tmp_path: Path) -> None:
    """b is written after a with a clock set back (NTP, a resumed VM): before, b looked least
    recently used and a put evicted the entry it had just written, for as long as the clock
    stayed behind."""
    store = CacheStore(tmp_path / "c.sqlite3", dim=384)
    store.upsert(_entry("a", 2000.0))
    store.upsert(_entry("b", 1000.0))
    assert store.lru_ids(1) == ["a"]
    assert store.lru_ids(2) == ["a", "b"]
    store.close()


def test_a_put_after_the_clock_was_set_back_keeps_its_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _FrozenTime(2_000_000.0)
    for mod in (semantic_mod, _mirror, _writes):  # the cache's modules that read the clock
        monkeypatch.setattr(mod, "time", clock)
    path = tmp_path / "c.sqlite3"
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder(), max_entries=1) as cache:
        cache.put(_msgs("how do I bake bread"), "knead", **KW)
        clock.now -= 60.0
        eid = cache.put(_msgs("who painted the mona lisa"), "da vinci", **KW)
        assert cache._store.get(eid) is not None
        assert cache.get(_msgs("who painted the mona lisa"), **KW).text == "da vinci"
        assert cache._store.count() == 1
