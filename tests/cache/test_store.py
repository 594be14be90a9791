"""The SQLite store under abuse: kill -9 in the middle of writes, corrupt and foreign files."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hybridllm._exceptions import CacheCorruptError
from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {}}
ROOT = Path(__file__).resolve().parents[2]

WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[2])
    from hybridllm.cache import SemanticCache
    from tests.cache.fakes import FakeEmbedder

    cache = SemanticCache(sys.argv[1], verifier=None, embedder=FakeEmbedder(), max_entries=10**6)
    i = 0
    while True:
        text = f"answer {i} " + "x" * 2000
        entry_id = cache.put([{"role": "user", "content": f"question number {i}"}], text,
                             model="m", params_key={})
        print(i, entry_id, flush=True)  # reported only once the put has committed
        i += 1
    """
)


def _record(line: str, committed: dict[int, str]) -> None:
    """A complete report line; a line cut by the kill proves nothing and is skipped."""
    fields = line.split()
    if line.endswith("\n") and len(fields) == 2 and len(fields[1]) == 32:
        committed[int(fields[0])] = fields[1]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_kill_9_during_writes_keeps_every_committed_entry(tmp_path: Path) -> None:
    path = tmp_path / "crash.sqlite3"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(ROOT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    committed: dict[int, str] = {}
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while len(committed) < 300 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        _record(line, committed)
    os.kill(proc.pid, signal.SIGKILL)  # mid-write: the child never stops putting
    proc.wait()
    for line in proc.stdout:  # lines printed before the kill also count as committed
        _record(line, committed)
    assert len(committed) >= 300, "the writer did not get going"

    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder(), max_entries=10**6)
    for i, entry_id in committed.items():
        hit = cache.get([{"role": "user", "content": f"question number {i}"}], **KW)
        assert hit is not None and hit.entry_id == entry_id
        assert hit.text == f"answer {i} " + "x" * 2000
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    cache.close()


def test_garbage_file_is_moved_aside_and_rebuilt_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "bad.sqlite3"
    path.write_bytes(os.urandom(8192))
    with pytest.warns(RuntimeWarning, match="corrupt"):
        cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    cache.put([{"role": "user", "content": "works again"}], "yes", **KW)
    cache.close()
    assert list(tmp_path.glob("bad.sqlite3.corrupt-*"))
    # the rebuilt file opens cleanly: no warning, no crash loop
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    assert cache.get([{"role": "user", "content": "works again"}], **KW).text == "yes"
    cache.close()


def test_truncated_database_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "trunc.sqlite3"
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    for i in range(200):
        cache.put([{"role": "user", "content": f"q{i}"}], "a" * 500, **KW)
    cache.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3] + b"\x00" * 100)
    with pytest.warns(RuntimeWarning):
        cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    assert cache.stats()["entries"] == 0
    cache.close()


def test_foreign_sqlite_database_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.execute("INSERT INTO users VALUES ('ada')")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(CacheCorruptError, match="not a hybridllm cache"):
        SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    assert path.read_bytes() == before


FULL_DISK = textwrap.dedent(
    """
    import resource, signal, sys
    sys.path.insert(0, sys.argv[2])
    from hybridllm import HybridLLM
    from hybridllm.backends.fake import FakeBackend
    from hybridllm.cache import SemanticCache
    from tests.cache.fakes import FakeEmbedder

    cache = SemanticCache(sys.argv[1], verifier=None, embedder=FakeEmbedder())
    # a tiny filesystem without root: no file of this process may grow past 96 KiB
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (96 * 1024, 96 * 1024))
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "x" * 4000), cache=cache)
    routes = [llm.chat(f"question {i}").route for i in range(40)]
    print(routes.count("edge"), routes.count("cache"), len(cache.stats()["namespaces"]) >= 0)
    again = llm.chat("question 0")
    print(again.route)
    """
)


def test_a_full_disk_never_costs_the_answer(tmp_path):
    """Before: after a few entries every new question raised sqlite3.OperationalError ('database
    or disk is full') from the store after the answer was generated (issue 19, item 6)."""
    out = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path / "c.sqlite3"), str(ROOT)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    counts, last = out.stdout.split("\n")[:2]
    assert counts.split()[:2] == ["40", "0"]  # every question answered, on the device
    assert last == "cache"  # what was stored before the disk filled is still served
    assert out.stderr.count("cannot store answers") == 1  # one warning, not one per request


def test_a_store_whose_writes_fail_raises_cache_error_at_every_step(tmp_path):
    from hybridllm._exceptions import CacheError
    from hybridllm.cache.store import _Transaction

    class Conn:
        def __init__(self, fail_at):
            self.fail_at = fail_at

        def execute(self, sql, *a):
            if self.fail_at == "begin":
                raise sqlite3.OperationalError("attempt to write a readonly database")

        def commit(self):
            raise sqlite3.OperationalError("database or disk is full")

        def rollback(self):
            pass

    for step in ("begin", "commit"):
        with pytest.raises(CacheError, match="readonly|disk is full"):
            with _Transaction(Conn(step), tmp_path / "x"):
                pass


def test_a_folder_given_as_the_cache_path_is_refused_and_never_moved(tmp_path: Path) -> None:
    """Before: sqlite could not open the folder, the store took that for corruption and renamed
    the user's folder to '<folder>.corrupt-<time>', then put a database in its place."""
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    with pytest.raises(CacheCorruptError, match="is a folder"):
        SemanticCache(folder, verifier=None, embedder=FakeEmbedder())
    assert (folder / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]


def test_a_database_that_cannot_be_opened_is_not_taken_for_a_corrupt_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: 'database is locked', 'unable to open database file' (a read-only folder) and the
    like moved a good cache aside as corrupt, or let a raw PermissionError out."""
    from hybridllm.cache.store import CacheStore

    path = tmp_path / "c.sqlite3"
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    cache.put([{"role": "user", "content": "kept"}], "yes", **KW)
    cache.close()

    def cannot_open(self: CacheStore) -> sqlite3.Connection:
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(CacheStore, "_open", cannot_open)
    with pytest.raises(CacheCorruptError, match="writable folder"):
        SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    monkeypatch.undo()
    assert not list(tmp_path.glob("*.corrupt-*"))
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    assert cache.get([{"role": "user", "content": "kept"}], **KW).text == "yes"
    cache.close()


def test_a_cache_dir_that_cannot_be_created_is_a_cache_error(tmp_path: Path) -> None:
    """Before: FileExistsError / PermissionError reached the user as an 'internal error'."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CacheCorruptError, match="writable folder"):
        SemanticCache(blocker / "cache.sqlite3", verifier=None, embedder=FakeEmbedder())


def test_two_corrupt_files_in_one_second_are_both_kept_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the second was renamed onto the first '<file>.corrupt-<time>', losing it."""
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.0)
    path = tmp_path / "bad.sqlite3"
    for _ in range(2):
        path.write_bytes(os.urandom(8192))
        with pytest.warns(RuntimeWarning, match="corrupt"):
            SemanticCache(path, verifier=None, embedder=FakeEmbedder()).close()
    assert len(list(tmp_path.glob("bad.sqlite3.corrupt-*"))) == 2
