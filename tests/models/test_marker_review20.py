"""The ".verified" marker lets a later run skip hashing a model file: it must record only a file
whose hash covered it whole (not one that changed while it was hashed). A stand-in catalog
with one tiny file keeps it fast: no hub, no real model hashed."""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridllm.models import _sources, catalog, store

MODEL = "marker-review20"
GOOD = bytes(range(256)) * 20
BAD = bytes(reversed(range(256))) * 20  # the same size, another content
SHA = hashlib.sha256(GOOD).hexdigest()
FILE = catalog.FileSpec("model.bin", SHA, len(GOOD))


@pytest.fixture
def path(tmp_path, monkeypatch) -> Iterator[Path]:
    """The model's one file in place, good, with no marker (a data dir copied from elsewhere)."""
    home = tmp_path / "home"
    monkeypatch.setenv("HYBRIDLLM_HOME", str(home))
    monkeypatch.setattr(store, "_BLOCK", 1024)  # several blocks: a change can come between them
    (tmp_path / "pkg" / "_data").mkdir(parents=True)
    entry = {
        "id": MODEL, "kind": "embedding", "description": "stand-in", "package": "no-such-package-20",
        "package_version": "1.0", "pip": "pip install no-such-package-20==1.0",
        "source": {"type": "dir", "path": "model"},
        "files": {FILE.name: {"sha256": SHA, "size": len(GOOD)}},
        "license": "MIT", "architecture": "bert", "chat_format": None,
    }
    (tmp_path / "pkg" / "_data" / "catalog.json").write_text(json.dumps({"version": 1, "models": [entry]}))
    catalog.load_catalog.cache_clear()
    real_files = importlib.resources.files
    monkeypatch.setattr(importlib.resources, "files",
                        lambda pkg: tmp_path / "pkg" if pkg == "hybridllm" else real_files(pkg))
    monkeypatch.setattr(_sources, "_package_root", lambda spec: tmp_path / "wheel")
    path = home / "models" / MODEL / FILE.name
    path.parent.mkdir(parents=True)
    path.write_bytes(GOOD)
    yield path
    catalog.load_catalog.cache_clear()


def _replace_with_bad(path: Path) -> None:
    """Another file of the same size renamed into place (a second pull, a user's copy)."""
    other = path.with_name("other.tmp")
    other.write_bytes(BAD)
    os.replace(other, path)


def test_verify_does_not_record_a_file_appended_to_while_it_was_hashed(path, monkeypatch):
    """Before: the marker was written after hashing with the file's new size and time, so the file
    was recorded as checked in a state the hash never saw, and later runs skipped the hash."""
    real = store.sha256_file

    def hash_then_append(p, progress=None):
        digest = real(p, progress)
        with p.open("ab") as f:  # written to before the hash's end was recorded
            f.write(b"more")
        return digest

    monkeypatch.setattr(store, "sha256_file", hash_then_append)
    [result] = store.verify(MODEL)
    assert result.status == "corrupt" and result.detail == (
        f"changed while it was checked: {FILE.name}; run `hybridllm models verify {MODEL}` again")
    assert not store._marker(path).exists() and not store.is_materialized(MODEL)
    monkeypatch.setattr(store, "sha256_file", real)
    assert "checksum mismatch: model.bin" in store.verify(MODEL)[0].detail  # run again: its real state


def test_verify_does_not_record_a_file_replaced_while_it_was_hashed(path, monkeypatch):
    """The hash read the good file to its end (an open file), a bad one was renamed in meanwhile:
    before, the bad one got the marker and was then trusted without a hash."""
    real = store.sha256_file

    def hash_then_replace(p, progress=None):
        digest = real(p, progress)
        _replace_with_bad(p)
        return digest

    monkeypatch.setattr(store, "sha256_file", hash_then_replace)
    assert store.verify(MODEL)[0].status == "corrupt"
    assert not store._marker_ok(path, SHA)


def test_verify_records_the_state_it_hashed(path):
    [result] = store.verify(MODEL)
    assert result.status == "ok" and store._marker_ok(path, SHA)
    meta = json.loads(store._marker(path).read_text())
    assert meta == {"sha256": SHA, "size": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns}


def test_adopt_does_not_record_a_file_replaced_while_it_was_hashed(path):
    """`_adopt` (a file already in place at pull time) had the same flaw: the bad file renamed in
    after the first block was kept, and marked verified."""
    calls = []

    def progress(done, total):
        if not calls:
            _replace_with_bad(path)
        calls.append(done)

    assert not store._adopt(path, FILE, progress)
    assert len(calls) > 1 and not store._marker_ok(path, SHA)
    assert path.read_bytes() == BAD  # not adopted, and nothing else touched


def test_adopt_keeps_an_unchanged_good_file(path):
    assert store._adopt(path, FILE, None) and store._marker_ok(path, SHA)
    assert store.pull_state(MODEL) == store.PULLED


def test_a_copy_that_keeps_size_and_mtime_stays_trusted(path, tmp_path):
    """The marker keys on size and mtime only, on purpose: a data dir baked into a container image
    or copied with its times (`cp -p`, `rsync -a`) gets new inodes and ctimes, and keying on those
    would hash a 3 GB model on every start. A file changed while it is hashed is caught above."""
    assert store._adopt(path, FILE, None)
    st = path.stat()
    copy = tmp_path / "copy"
    copy.write_bytes(path.read_bytes())
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(copy, path)  # a new inode and ctime, the same size and mtime
    assert path.stat().st_ino != st.st_ino or path.stat().st_ctime_ns != st.st_ctime_ns
    assert store._marker_ok(path, SHA) and store.pull_state(MODEL) == store.PULLED
