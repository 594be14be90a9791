"""A cache whose file another process moved aside as corrupt (and replaced with a rebuilt one)
goes over to the new file at its next lookup or write. Before, it went on reading and writing the
moved-aside file through its open connection: what it stored from then on reached no other process,
nor itself at its next start (a server running beside `hybridllm cache stats`, which rebuilt it)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder
from .test_store_root_page_review28 import KW, N, _filled, _msgs, _root_and_page_size, _smash


def test_a_cache_open_while_another_process_rebuilds_its_file_follows_the_new_file(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    _filled(path)
    root, page_size = _root_and_page_size(path)
    server = SemanticCache(path, verifier=None, embedder=FakeEmbedder())  # open, as a server is
    _smash(path, root, page_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "moved it to ...corrupt-..."
        other = SemanticCache(path, verifier=None, embedder=FakeEmbedder())  # finds it, rebuilds it
    assert (tmp_path / "c.sqlite3").exists() and list(tmp_path.glob("c.sqlite3.corrupt-*"))
    server.put([{"role": "user", "content": "asked after the rebuild"}], "kept", **KW)
    # the other process sees it (before: None, it went to the moved-aside file)
    assert other.get([{"role": "user", "content": "asked after the rebuild"}], **KW).text == "kept"
    assert server.get(_msgs(7), **KW).text.startswith("answer 7 ")  # salvaged, read from the new file
    server.close()
    other.close()
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder()) as again:  # and at a next start
        assert again.stats()["entries"] == N + 1


def test_a_cache_whose_file_was_deleted_writes_a_new_one(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    cache.put(_msgs(1), "one", **KW)
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{path}{suffix}").exists():
            os.remove(f"{path}{suffix}")
    assert cache.get(_msgs(1), **KW) is None  # gone with its file
    cache.put(_msgs(2), "two", **KW)
    cache.close()
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder()) as again:
        assert again.get(_msgs(2), **KW).text == "two"  # before: written to the deleted file
