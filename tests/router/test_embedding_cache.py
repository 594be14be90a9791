"""The embeddings cache: a list it has seen whole is read back; a list that grew embeds only its
new texts; broken files are recomputed, never trusted."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm.router import embedding_cache
from hybridllm.router.features import EMBEDDING_DIM


def _vectors(texts):
    out = np.zeros((len(texts), EMBEDDING_DIM), dtype=np.float32)
    for i, t in enumerate(texts):
        out[i, sum(t.encode()) % EMBEDDING_DIM] = 1.0
        out[i, len(t) % EMBEDDING_DIM] += 2.0
    return out


def _fake(monkeypatch):
    """A deterministic embedder (``_vectors``) that records what it was asked to embed."""
    calls: list[list[str]] = []

    def embed(texts, progress=None):
        calls.append(list(texts))
        if progress is not None:
            progress(len(texts), len(texts))
        return _vectors(texts)

    monkeypatch.setattr(embedding_cache, "embed_texts", embed)
    monkeypatch.setattr(embedding_cache, "embedder_fingerprint", lambda: "f" * 12)
    return _vectors, calls


def test_a_grown_list_embeds_only_its_new_texts(tmp_path, monkeypatch):
    embed, calls = _fake(monkeypatch)
    first = [f"question {i}" for i in range(50)]
    a = embedding_cache.cached_embeddings(first, cache_dir=tmp_path)
    assert calls == [first]
    np.testing.assert_array_equal(a, embed(first))
    calls.clear()
    # the same list: read back whole
    np.testing.assert_array_equal(embedding_cache.cached_embeddings(first, cache_dir=tmp_path), a)
    assert calls == []
    # rows appended (a resumed labelling run), one edited, one repeated, the order changed
    grown = ["new one", *reversed(first[1:]), "question 0 (edited)", "new two", "question 7"]
    progress = []
    b = embedding_cache.cached_embeddings(grown, cache_dir=tmp_path, progress=lambda d, t: progress.append(t))
    assert calls == [["new one", "question 0 (edited)", "new two"]]
    assert progress == [3]
    calls.clear()
    np.testing.assert_array_equal(b, embed(grown))
    assert len(list(tmp_path.glob("*.npz"))) == 2  # "question 0" is only in the first file
    # rows appended to the grown list: its file is replaced, not joined by a third
    appended = [*grown, "new three"]
    got = embedding_cache.cached_embeddings(appended, cache_dir=tmp_path)
    np.testing.assert_array_equal(got, embed(appended))
    assert calls == [["new three"]] and len(list(tmp_path.glob("*.npz"))) == 2
    calls.clear()
    # a subset of both lists: nothing to embed
    subset = ["new two", "question 3"]
    got = embedding_cache.cached_embeddings(subset, cache_dir=tmp_path)
    np.testing.assert_array_equal(got, embed(subset))
    assert calls == []


def test_broken_or_old_files_are_recomputed(tmp_path, monkeypatch):
    embed, calls = _fake(monkeypatch)
    texts = ["a", "b", "c"]
    embedding_cache.cached_embeddings(texts, cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.npz")
    path.write_bytes(b"not an npz")  # a partial write or another program's file
    calls.clear()
    np.testing.assert_array_equal(embedding_cache.cached_embeddings(texts, cache_dir=tmp_path), embed(texts))
    assert calls == [texts]
    # a file written before per-text hashes: still read whole, never used for other lists
    np.savez(path, embeddings=embed(texts))
    calls.clear()
    np.testing.assert_array_equal(embedding_cache.cached_embeddings(texts, cache_dir=tmp_path), embed(texts))
    assert calls == []
    embedding_cache.cached_embeddings(["a", "d"], cache_dir=tmp_path)
    assert calls == [["a", "d"]]


def test_the_file_being_written_and_batched_files(tmp_path, monkeypatch):
    """The file about to be written is never counted as covered (another process may have just
    written it; removing it after our own write would lose it), and files of batched vectors
    (names without '-single-') are removed once a new file is written."""
    _, calls = _fake(monkeypatch)
    texts = ["a", "b"]
    embedding_cache.cached_embeddings(texts, cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.npz")
    emb = np.zeros((2, EMBEDDING_DIM), dtype=np.float32)
    missing, covered = embedding_cache._fill_from_other_files(
        tmp_path, path.name[: -len("x" * 20 + ".npz")], embedding_cache._text_keys(texts), emb, skip=path
    )
    assert covered == [] and list(missing) == [0, 1]
    old = tmp_path / f"{embedding_cache.EMBEDDER_ID}-{'f' * 12}-{'0' * 20}.npz"
    np.savez(old, embeddings=_vectors(["z"]))
    embedding_cache.cached_embeddings(["c"], cache_dir=tmp_path)
    assert not old.exists() and path.exists()


def test_a_cache_that_cannot_be_written_still_gives_the_vectors(tmp_path, monkeypatch):
    """A full disk or a read-only cache folder costs the cache, not the training run that just
    spent minutes embedding (it ended in an OSError), and leaves no partial file behind."""
    embed, _ = _fake(monkeypatch)
    real_savez = np.savez

    def disk_full(file, **arrays):
        real_savez(file, **arrays)  # written, then the disk fills
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(embedding_cache.np, "savez", disk_full)
    texts = [f"question {i}" for i in range(5)]
    with pytest.warns(RuntimeWarning, match="No space left"):
        got = embedding_cache.cached_embeddings(texts, cache_dir=tmp_path)
    np.testing.assert_array_equal(got, embed(texts))
    assert list(tmp_path.iterdir()) == []
