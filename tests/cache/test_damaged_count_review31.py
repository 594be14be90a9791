"""``hybridllm cache stats`` shows how many rows were found damaged and removed (review 31).

Before, the count lived only in the object that found them (``stats()["checksum_failures"]``):
the CLI, another process or a later run never saw it. Now the delete of damaged rows adds the
rows it removed to a ``cache_meta`` key in the same transaction (no schema change: older
versions ignore the key), so every process, ``cache stats`` (text and ``--json``) and
``SemanticCache.stats()["damaged_entries"]`` read one count; a row two processes both found is
counted once (only the delete that removed it counts); a full clear resets it, as the lookups.
"""

from __future__ import annotations

import json
import sqlite3
import warnings
from pathlib import Path

import pytest

from hybridllm import cli
from hybridllm.cache import SemanticCache
from hybridllm.cache.store import CacheStore

from .test_row_checksum_review30 import BAD_Q, GOOD_A, GOOD_Q, KW, _edit, _filled, _ids, _msgs, _open


def _stats_json(capsys: pytest.CaptureFixture[str], path: Path) -> dict:
    assert cli.main(["cache", "stats", "--json", "--path", str(path)]) == 0
    return json.loads(capsys.readouterr().out)


def _stats_text(capsys: pytest.CaptureFixture[str], path: Path) -> str:
    assert cli.main(["cache", "stats", "--path", str(path)]) == 0
    return capsys.readouterr().out


def _found_by_a_client(path: Path) -> SemanticCache:
    """A client that loads the file, finds the damaged row, removes it, and is closed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "Removed 1 damaged entries"
        cache = _open(path)
    cache.close()
    return cache


def test_cache_stats_shows_the_rows_another_process_found_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.sqlite3"
    bad = _filled(path)
    assert _stats_json(capsys, path)["damaged_entries"] == 0
    assert "damaged:     none found" in _stats_text(capsys, path)
    _edit(path, "UPDATE entries SET response = 'other text' WHERE id = ?", bad)
    _found_by_a_client(path)
    stats = _stats_json(capsys, path)
    assert stats["damaged_entries"] == 1 and stats["entries"] == 1
    assert "damaged:     1 entry found damaged and removed" in _stats_text(capsys, path)
    with _open(path) as later:  # a later client: it found none itself, the file says one
        assert later.get(_msgs(GOOD_Q), **KW).text == GOOD_A
        assert later.stats()["checksum_failures"] == 0
        assert later.stats()["damaged_entries"] == 1


def test_more_damaged_rows_add_up_and_a_full_clear_resets_the_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.sqlite3"
    _filled(path)
    _edit(path, "UPDATE entries SET response = response || '!'")  # both rows
    _found_by_a_client(path)
    assert "damaged:     2 entries found damaged and removed" in _stats_text(capsys, path)
    bad = _filled(path)
    _edit(path, "UPDATE entries SET query = 'changed' WHERE id = ?", bad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with _open(path) as cache:
            assert cache.get(_msgs(BAD_Q), **KW) is None
            assert cache.stats()["damaged_entries"] == 3
    assert _stats_json(capsys, path)["damaged_entries"] == 3
    assert cli.main(["cache", "clear", "--namespace", "default", "--path", str(path)]) == 0
    assert "removed 1 entry" in capsys.readouterr().out
    assert _stats_json(capsys, path)["damaged_entries"] == 3  # a namespace clear keeps it
    assert cli.main(["cache", "clear", "--path", str(path)]) == 0
    assert "from all namespaces" in capsys.readouterr().out
    assert _stats_json(capsys, path)["damaged_entries"] == 0


def test_a_row_two_processes_found_is_counted_once(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    bad = _filled(path)
    one, two = CacheStore(path, dim=None), CacheStore(path, dim=None)
    try:
        assert one.delete([bad], damaged=True) == 1
        assert two.delete([bad], damaged=True) == 0  # the other removed it first
        assert one.delete(["no-such-id"], damaged=True) == 0
        assert one.damaged_count() == two.damaged_count() == 1
        assert two.delete([next(iter(_ids(path)))]) == 1  # a plain delete is no damage
        assert one.damaged_count() == 1
    finally:
        one.close()
        two.close()


def test_the_count_is_a_meta_key_not_a_schema_change(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    bad = _filled(path)
    con = sqlite3.connect(path)
    before = con.execute("SELECT value FROM cache_meta WHERE key = 'version'").fetchone()
    con.close()
    _edit(path, "UPDATE entries SET response = 'other text' WHERE id = ?", bad)
    _found_by_a_client(path)
    con = sqlite3.connect(path)
    try:
        meta = dict(con.execute("SELECT key, value FROM cache_meta"))
    finally:
        con.close()
    assert int(meta["damaged"]) == 1 and (meta["version"],) == before
