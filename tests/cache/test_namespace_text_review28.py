"""A namespace or entry id holding a lone UTF-16 surrogate (half an emoji, "\\ud83d", which a JSON
escape or a cut string gives) reached SQLite, which cannot encode it: ``put`` and ``clear`` raised
a bare ``UnicodeEncodeError``, and so did ``delete`` for such an id. Now the namespace is refused
with ``InvalidRequestError`` (``ConfigError`` as the cache's default), and ``delete`` of an id no
row can have returns False."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm._exceptions import ConfigError, InvalidRequestError
from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {}}
HALF = "tenant-\ud83d"


def _cache(path: Path) -> SemanticCache:
    return SemanticCache(path / "c.sqlite3", verifier=None, embedder=FakeEmbedder())


def test_a_namespace_with_half_an_emoji_is_refused_clearly(tmp_path: Path) -> None:
    with _cache(tmp_path) as cache:
        for call in (
            lambda: cache.put([{"role": "user", "content": "q"}], "a", namespace=HALF, **KW),
            lambda: cache.clear(HALF),
            lambda: cache.get([{"role": "user", "content": "q"}], namespace=HALF, **KW),
        ):
            with pytest.raises(InvalidRequestError, match="namespace holds a lone UTF-16 surrogate"):
                call()
        # the cache goes on working, and a namespace with the whole emoji is fine
        whole = "tenant-\U0001f600"
        assert cache.put([{"role": "user", "content": "q"}], "a", namespace=whole, **KW) is not None
        assert cache.get([{"role": "user", "content": "q"}], namespace=whole, **KW).text == "a"
        assert cache.clear(whole) == 1


def test_the_default_namespace_is_checked_when_the_cache_is_made(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="lone UTF-16 surrogate"):
        SemanticCache(tmp_path / "c.sqlite3", namespace=HALF, verifier=None, embedder=FakeEmbedder())


def test_deleting_an_id_no_row_can_have_is_false(tmp_path: Path) -> None:
    with _cache(tmp_path) as cache:
        kept = cache.put([{"role": "user", "content": "q"}], "a", **KW)
        assert cache.delete("x\ud800") is False
        assert cache.delete(kept) is True
