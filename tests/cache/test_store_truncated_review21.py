"""A cache file cut short (a copy cut off, a disk that filled up) keeps the entries on the pages it
still has: SQLite refuses a file shorter than its header says before reading any page, so the
rebuild used to keep none of them."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}
N = 120


def _msgs(i: int) -> list[dict]:
    return [{"role": "user", "content": f"what is the story of town{i}"}]


def _filled(path: Path) -> None:
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    for i in range(N):
        cache.put(_msgs(i), f"answer {i} " + "x" * 400, **KW)
    cache.close()
    assert not Path(f"{path}-wal").exists()  # all in the file itself


@pytest.mark.parametrize("cut", [0.5, 0.8])
def test_a_file_cut_short_keeps_its_readable_entries(tmp_path: Path, cut: float) -> None:
    path = tmp_path / "c.sqlite3"
    _filled(path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(int(size * cut) + 123)  # not even a whole page at the end
    with pytest.warns(RuntimeWarning, match=r"corrupt.*moved it to .*kept the \d+ entries"):
        cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    kept = cache.stats()["entries"]
    assert N * cut * 0.5 < kept < N
    hit = cache.get(_msgs(0), **KW)  # the first entries sit on the first pages
    assert hit is not None and hit.text.startswith("answer 0 ")
    assert cache.get(_msgs(N - 1), **KW) is None  # the last ones were on the pages cut off
    cache.close()
    assert list(tmp_path.glob("c.sqlite3.corrupt-*"))  # the damaged file is kept aside
    with warnings.catch_warnings():  # the rebuilt file is whole
        warnings.simplefilter("error")
        again = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    assert again.stats()["entries"] == kept
    again.close()


def test_a_file_cut_before_its_entries_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    _filled(path)
    with open(path, "r+b") as f:
        f.truncate(4096)  # the schema page only
    with pytest.warns(RuntimeWarning, match="started an empty cache"):
        cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    assert cache.stats()["entries"] == 0
    cache.put(_msgs(1), "again", **KW)
    assert cache.get(_msgs(1), **KW).text == "again"
    cache.close()
