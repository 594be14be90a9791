"""TTL and max_entries: settings that cannot work are refused, and eviction drops the dead first."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm._exceptions import ConfigError
from hybridllm.cache import SemanticCache
from hybridllm.cache import semantic as semantic_mod

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize(
    "settings",
    [
        {"ttl_s": float("nan")},
        {"ttl_s": "3600"},
        {"max_entries": 2.5},
        {"max_entries": True},
        {"top_k": 2.5},
    ],
)
def test_settings_that_cannot_work_are_refused(tmp_path: Path, settings: dict) -> None:
    """Before: ttl_s=nan (HYBRIDLLM_CACHE_TTL_S=nan) was accepted and every entry then read as
    expired, a cache that silently never hit; top_k=2.5 failed inside numpy at the first lookup."""
    with pytest.raises(ConfigError, match=next(iter(settings))):
        SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder(), **settings)


def test_integer_like_settings_still_work(tmp_path: Path) -> None:
    import numpy as np

    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder(),
                          ttl_s=float("inf"), max_entries=np.int64(2), top_k=np.int32(3))
    for q in ("first question", "second question", "kept forever"):  # the third evicts one
        cache.put(user(q), q, **KW)
    assert cache.get(user("kept forever"), **KW) is not None
    assert cache.stats()["entries"] == 2
    cache.close()


class _Clock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def test_a_full_cache_evicts_expired_entries_before_live_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: past max_entries the least recently *used* entry went, expired or not. An entry hit
    just before it expired outranked a live one not hit since: the live answer was evicted and
    the dead one kept (expired entries were purged once a minute only)."""
    clock = _Clock(1_000_000.0)
    monkeypatch.setattr(semantic_mod.time, "time", clock)
    cache = SemanticCache(tmp_path / "c.sqlite3", ttl_s=30, max_entries=2, verifier=None,
                          embedder=FakeEmbedder())
    cache.put(user("old question"), "old", **KW)  # t=0: the first put also purges
    clock.now += 20
    cache.put(user("live question"), "live", **KW)  # t=20, never hit after
    clock.now += 5
    assert cache.get(user("old question"), **KW) is not None  # t=25: last used after "live"
    clock.now += 15  # t=40: "old" expired at t=30, the once-a-minute purge is not due
    cache.put(user("new question"), "new", **KW)
    hit = cache.get(user("live question"), **KW)
    assert hit is not None and hit.text == "live"
    assert cache.get(user("new question"), **KW) is not None
    assert cache.get(user("old question"), **KW) is None
    assert cache._store.count() == 2
    cache.close()
