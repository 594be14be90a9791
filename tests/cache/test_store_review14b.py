"""Review 14b of the cache store: a newer schema's file is refused, never moved aside."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hybridllm._exceptions import CacheCorruptError
from hybridllm.cache import SemanticCache
from hybridllm.cache._store_file import SCHEMA_VERSION

from .fakes import FakeEmbedder


@pytest.mark.parametrize("dim", [None, "[384, 768]"])
def test_a_newer_schema_without_our_dim_key_is_refused_and_left_untouched(tmp_path: Path, dim) -> None:
    """A newer hybridllm may keep its own bookkeeping (here: no ``dim`` row, or another form of
    it). Before: the dim was parsed before the version was checked, so the file read as corrupt
    and was moved to ``.corrupt-*`` under the newer version's feet, a fresh cache in its place."""
    path = tmp_path / "newer.sqlite3"
    SemanticCache(path, verifier=None, embedder=FakeEmbedder()).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE cache_meta SET value = ? WHERE key = 'version'", (str(SCHEMA_VERSION + 1),))
        if dim is None:
            conn.execute("DELETE FROM cache_meta WHERE key = 'dim'")
        else:
            conn.execute("UPDATE cache_meta SET value = ? WHERE key = 'dim'", (dim,))
    conn.close()
    before = path.read_bytes()
    with pytest.raises(CacheCorruptError, match="newer hybridllm"):
        SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_our_own_garbled_dim_is_still_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    SemanticCache(path, verifier=None, embedder=FakeEmbedder()).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE cache_meta SET value = 'x' WHERE key = 'dim'")
    conn.close()
    with pytest.warns(RuntimeWarning, match="corrupt"):
        SemanticCache(path, verifier=None, embedder=FakeEmbedder()).close()
    assert len(list(tmp_path.glob("c.sqlite3.corrupt-*"))) == 1
