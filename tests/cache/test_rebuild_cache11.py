"""A corrupt cache file opened by several processes at once is rebuilt once, into one shared file."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridllm._exceptions import CacheCorruptError
from hybridllm.cache.store import CacheStore, Entry


def _entry(i: int) -> Entry:
    vec = np.zeros(384, dtype=np.float32)
    vec[i % 384] = 1.0
    return Entry(f"id{i}", "default", "b", f"q{i}", f"a{i}", vec, 1.0, 1.0, None)


def test_a_file_rebuilt_meanwhile_by_another_process_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a process that found the file corrupt moved it aside even when another process had
    rebuilt it in the meantime, so it moved aside the fresh cache (and its new entries) the other
    process was writing to, through a connection that kept writing to the renamed file."""
    path = tmp_path / "c.sqlite3"
    other = CacheStore(path, dim=384)  # the process that rebuilt the file first
    other.upsert(_entry(1))
    real_open = CacheStore._open
    calls = []

    def first_look_saw_it_corrupt(self: CacheStore) -> sqlite3.Connection:
        calls.append(1)
        if len(calls) == 1:
            raise sqlite3.DatabaseError("file is not a database")
        return real_open(self)

    monkeypatch.setattr(CacheStore, "_open", first_look_saw_it_corrupt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "moved it aside" warning
        late = CacheStore(path, dim=384)
    assert not list(tmp_path.glob("c.sqlite3.corrupt-*"))
    assert late.get("id1") is not None
    late.upsert(_entry(2))
    assert other.get("id2") is not None  # still one shared file
    late.close()
    other.close()


def _open_and_write(path: str, i: int, start: Any) -> None:
    start.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        store = CacheStore(path, dim=384)
    store.upsert(_entry(i))
    store.close()


def test_processes_opening_one_corrupt_file_at_once_share_the_rebuilt_one(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    path.write_bytes(b"not a database at all" * 100)
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_open_and_write, args=(str(path), i, start)) for i in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(list(tmp_path.glob("c.sqlite3.corrupt-*"))) == 1  # the garbage, moved aside once
    store = CacheStore(path, dim=384)
    assert store.count() == 4  # every process wrote to the one file
    store.close()


def test_a_corrupt_file_that_cannot_be_moved_aside_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the OSError of moving the file aside (a folder the user cannot write) came out
    raw, as a traceback in the CLI, instead of the cache's error naming what to do."""
    path = tmp_path / "c.sqlite3"
    path.write_bytes(b"garbage" * 100)

    def refused(self: Path, target: object) -> Path:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "replace", refused)
    with pytest.raises(CacheCorruptError, match="HYBRIDLLM_CACHE_DIR"):
        CacheStore(path, dim=384)
    assert path.read_bytes() == b"garbage" * 100
