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
    # the entries on the pages the file still has are kept (review 21: before, none was)
    assert 0 < cache.stats()["entries"] < 200
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
    from hybridllm.cache._store_writes import _Transaction

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


# ---------------------------------------------------------------------- two processes, one file


def _count_reloads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = SemanticCache._reload

    def counted(self: SemanticCache) -> None:
        calls[0] += 1
        real(self)

    monkeypatch.setattr(SemanticCache, "_reload", counted)
    return calls


def _ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_another_process_s_writes_are_read_from_the_change_log_not_by_reloading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: every commit by another connection (each hit's recency write included) made this one
    reload every entry; two processes serving hits from a 10,000-entry file spent about 0.3 s of
    each lookup reloading."""
    from hybridllm.cache import _store_writes

    path = tmp_path / "shared.sqlite3"
    one = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    two = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    for i in range(50):
        one.put(_ask(f"question {i}"), f"answer {i}", **KW)
    reloads = _count_reloads(monkeypatch)
    assert two.get(_ask("question 7"), **KW).text == "answer 7"  # 50 new entries, read by id
    assert one.get(_ask("question 8"), **KW) is not None  # one's hit writes recency...
    assert two.get(_ask("question 9"), **KW) is not None  # ...which two need not read
    one.put(_ask("question 7"), "answer 7, again", **KW)  # replaced
    one.delete(one.get(_ask("question 9"), **KW).entry_id)  # removed
    assert two.get(_ask("question 7"), **KW).text == "answer 7, again"
    assert two.get(_ask("question 9"), **KW) is None
    assert two.stats()["entries"] == 49
    assert one.clear(namespace="default") == 49
    assert two.get(_ask("question 1"), **KW) is None and two.stats()["entries"] == 0
    assert reloads[0] == 0
    monkeypatch.setattr(_store_writes, "_MAX_LOGGED", 10)  # a bulk change is one mark: reload everything
    for i in range(20):
        one.put(_ask(f"question {i}"), f"answer {i}", **KW)
    assert two.get(_ask("question 19"), **KW).text == "answer 19" and reloads[0] == 0
    one.clear()
    assert two.get(_ask("question 19"), **KW) is None and reloads[0] == 1
    one.close()
    two.close()


def test_a_reader_behind_the_trimmed_change_log_reloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hybridllm.cache import _store_writes

    monkeypatch.setattr(_store_writes, "_KEEP_CHANGES", 5)
    path = tmp_path / "trim.sqlite3"
    one = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    two = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    one.put(_ask("first"), "1", **KW)
    assert two.get(_ask("first"), **KW).text == "1"
    for i in range(20):  # far more changes than the log keeps
        one.put(_ask(f"later {i}"), str(i), **KW)
    one.delete(one.get(_ask("first"), **KW).entry_id)
    reloads = _count_reloads(monkeypatch)
    assert two.get(_ask("first"), **KW) is None and two.get(_ask("later 3"), **KW).text == "3"
    assert reloads[0] == 1 and two.stats()["entries"] == 20
    one.close()
    two.close()


PROCESS = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[2])
    from hybridllm.cache import SemanticCache
    from tests.cache.fakes import FakeEmbedder

    me = sys.argv[3]
    cache = SemanticCache(sys.argv[1], verifier=None, embedder=FakeEmbedder(), max_entries=10**6)
    for i in range(150):
        cache.put([{"role": "user", "content": f"{me} asks {i}"}], f"{me}-{i}", model="m", params_key={})
        hit = cache.get([{"role": "user", "content": f"{me} asks {i}"}], model="m", params_key={})
        assert hit is not None and hit.text == f"{me}-{i}", (i, hit)
        if i % 10 == 0:  # the others' answers: each served its own, never a neighbour's
            for other in ("a", "b", "c"):
                hit = cache.get([{"role": "user", "content": f"{other} asks 0"}], model="m", params_key={})
                assert hit is None or hit.text == f"{other}-0", hit
    print(cache.stats()["entries"])
    """
)


def test_three_processes_write_and_read_one_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "busy.sqlite3"
    procs = [
        subprocess.Popen([sys.executable, "-c", PROCESS, str(path), str(ROOT), me],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for me in ("a", "b", "c")
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder(), max_entries=10**6)
    assert cache.stats()["entries"] == 450 and cache.stats()["total_hits"] >= 450
    assert cache.get(_ask("b asks 149"), **KW).text == "b-149"
    cache.close()


# ---------------------------------------------------------------------- files of other shapes


def test_a_cache_file_of_an_older_shape_is_rebuilt_and_a_newer_one_refused(tmp_path: Path) -> None:
    """Before: a hybridllm cache whose tables lacked a column this version reads opened, then every
    lookup failed with a raw IndexError or sqlite3 error; a garbled version raised ValueError."""
    old = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(old)
    conn.executescript(
        "CREATE TABLE cache_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO cache_meta VALUES ('format', 'hybridllm-semantic-cache'), ('version', '0'),"
        " ('dim', '384');"
        "CREATE TABLE entries (id TEXT PRIMARY KEY, query TEXT, response TEXT);"
        "INSERT INTO entries VALUES ('x', 'q', 'a');"
    )
    conn.commit()
    conn.close()
    with pytest.warns(RuntimeWarning, match="columns"):
        cache = SemanticCache(old, verifier=None, embedder=FakeEmbedder())
    cache.put(_ask("works"), "yes", **KW)
    assert cache.get(_ask("works"), **KW).text == "yes"
    cache.close()
    assert list(tmp_path.glob("old.sqlite3.corrupt-*"))

    garbled = tmp_path / "garbled.sqlite3"
    SemanticCache(garbled, verifier=None, embedder=FakeEmbedder()).close()
    conn = sqlite3.connect(garbled)
    conn.execute("UPDATE cache_meta SET value = 'one' WHERE key = 'version'")
    conn.commit()
    conn.close()
    with pytest.warns(RuntimeWarning, match="corrupt"):
        SemanticCache(garbled, verifier=None, embedder=FakeEmbedder()).close()

    newer = tmp_path / "newer.sqlite3"
    SemanticCache(newer, verifier=None, embedder=FakeEmbedder()).close()
    conn = sqlite3.connect(newer)
    conn.execute("UPDATE cache_meta SET value = '99' WHERE key = 'version'")
    conn.commit()
    conn.close()
    before = newer.read_bytes()
    with pytest.raises(CacheCorruptError, match="newer hybridllm"):
        SemanticCache(newer, verifier=None, embedder=FakeEmbedder())
    assert newer.read_bytes() == before


def test_a_file_of_another_dimension_is_refused_with_advice_that_works(tmp_path: Path) -> None:
    """Before: the error said to run `hybridllm cache clear`, which opened the file the same way
    and failed with the same error."""
    from hybridllm.cache.store import CacheStore

    class Wide(FakeEmbedder):
        dim = 768

    path = tmp_path / "wide.sqlite3"
    wide = SemanticCache(path, verifier=None, embedder=Wide())
    wide.put(_ask("wide question"), "w", **KW)
    wide.close()
    before = path.read_bytes()
    with pytest.raises(CacheCorruptError, match="768-dim") as err:
        SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    assert "--path" in str(err.value) and path.read_bytes() == before
    store = CacheStore(path, dim=None)  # what the advice runs: the file's own dimension
    assert store.dim == 768 and len(store.clear()) == 1
    store.close()


def test_asking_again_in_other_words_updates_the_stored_question(tmp_path: Path) -> None:
    """Before: a re-put under the same key kept the first wording in the file while memory held
    the new one, so the verifier compared against a text the file did not have."""
    path = tmp_path / "q.sqlite3"
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    cache.put(_ask("How do I learn Python?"), "first", **KW)
    cache.put(_ask("how do i learn python"), "second", **KW)
    cache.close()
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    hit = cache.get(_ask("HOW DO I LEARN PYTHON"), **KW)
    assert hit.text == "second" and hit.cached_query == "how do i learn python"
    cache.close()


def test_another_program_s_cache_meta_table_is_never_written(tmp_path: Path) -> None:
    """Before: the format was checked after WAL mode and our tables had been put into the file."""
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE cache_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO cache_meta VALUES ('format', 'someone-elses-cache')")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(CacheCorruptError, match="another program"):
        SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    assert path.read_bytes() == before and not Path(f"{path}-wal").exists()
