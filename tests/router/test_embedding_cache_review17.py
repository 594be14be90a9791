"""The embeddings cache never hands back another list's vectors under a shared file name."""

from __future__ import annotations

import numpy as np

from hybridllm.router import embedding_cache
from hybridllm.router.dataset import texts_digest
from tests.router.test_embedding_cache import _fake


def test_a_file_named_for_other_texts_is_not_read_as_these(tmp_path, monkeypatch):
    """The digest joins texts with NUL: ["a\\0b", ""] and ["a", "b\\0"] name one file, and the
    second list got the first one's vectors (its file's text hashes were never compared)."""
    embed, calls = _fake(monkeypatch)
    first, second = ["a\x00b", ""], ["a", "b\x00"]
    assert texts_digest(first) == texts_digest(second)  # the premise
    embedding_cache.cached_embeddings(first, cache_dir=tmp_path)
    calls.clear()
    got = embedding_cache.cached_embeddings(second, cache_dir=tmp_path)
    np.testing.assert_array_equal(got, embed(second))
    assert calls == [second]
    # and the same list is still read back whole, embedding nothing
    calls.clear()
    again = embedding_cache.cached_embeddings(second, cache_dir=tmp_path)
    np.testing.assert_array_equal(again, embed(second))
    assert calls == []


def test_a_renamed_file_is_not_read_as_another_list(tmp_path, monkeypatch):
    embed, calls = _fake(monkeypatch)
    embedding_cache.cached_embeddings(["x", "y"], cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.npz")
    other = ["p", "q"]
    target = path.with_name(path.name[: -len("x" * 20 + ".npz")] + texts_digest(other) + ".npz")
    path.rename(target)  # a copy under the name the other list's file would have
    calls.clear()
    np.testing.assert_array_equal(embedding_cache.cached_embeddings(other, cache_dir=tmp_path), embed(other))
    assert calls == [other]
