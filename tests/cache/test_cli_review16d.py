"""`hybridllm cache stats | clear` on files that are not caches, on a quoted "~" path, and what
`clear` leaves on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridllm import cli
from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {}}


def _fill(path: Path, n: int = 1) -> None:
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    for i in range(n):
        cache.put([{"role": "user", "content": f"question {i}"}], f"PRIVATE-{i:04d} " + "y" * 200, **KW)
    cache.close()


@pytest.mark.parametrize("action", ["stats", "clear"])
@pytest.mark.parametrize("via", ["--path", "config"])
def test_a_file_that_is_not_sqlite_is_refused_and_left_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], action: str, via: str
) -> None:
    """Before: a mistyped path to notes.txt moved the notes to notes.txt.corrupt-<time> and made
    an empty cache named notes.txt, even for the read-only `stats`."""
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"my private notes, not a cache\n" * 10)
    if via == "--path":
        argv = ["cache", action, "--path", str(notes)]
    else:
        monkeypatch.setenv("HYBRIDLLM_CACHE_PATH", str(notes))
        argv = ["cache", action]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert str(notes) in err and "not a cache database" in err
    assert notes.read_bytes() == b"my private notes, not a cache\n" * 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("action", ["stats", "clear"])
def test_an_empty_file_is_not_made_into_a_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], action: str
) -> None:
    """Before: `stats --path empty` wrote a cache (tables, a WAL) into an empty file."""
    empty = tmp_path / "empty.sqlite3"
    empty.touch()
    assert cli.main(["cache", action, "--path", str(empty)]) == 0
    out = capsys.readouterr().out
    assert ("entries:     0" in out) if action == "stats" else ("nothing to clear" in out)
    assert empty.stat().st_size == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["empty.sqlite3"]


def test_a_quoted_tilde_path_is_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: --path "~/c.sqlite3" (quoted, so the shell left it) was taken literally: "There is
    no cache database at ~/c.sqlite3", while cache_path = "~/c.sqlite3" was expanded."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    _fill(tmp_path / "c.sqlite3")
    assert cli.main(["cache", "stats", "--json", "--path", "~/c.sqlite3"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["path"] == str(tmp_path / "c.sqlite3") and stats["entries"] == 1
    assert cli.main(["cache", "clear", "--path", "~/c.sqlite3"]) == 0
    assert "removed 1 entry from all namespaces" in capsys.readouterr().out


def test_clear_says_entry_for_one_and_leaves_no_text_on_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: "removed 1 entries"; and the file kept its size after a clear."""
    path = tmp_path / "c.sqlite3"
    _fill(path, 200)
    before = path.stat().st_size
    assert cli.main(["cache", "clear", "--path", str(path)]) == 0
    assert "removed 200 entries from all namespaces" in capsys.readouterr().out
    raw = b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())
    assert raw.count(b"PRIVATE-") == 0 and path.stat().st_size < before / 4
    _fill(path)
    assert cli.main(["cache", "clear", "--path", str(path), "--namespace", "default"]) == 0
    assert "removed 1 entry from namespace 'default'" in capsys.readouterr().out
