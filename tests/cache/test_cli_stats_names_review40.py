"""`hybridllm cache stats` lists each namespace with its entry count. A name of 24 characters or
more (a tenant's UUID) ran into its count ("...4466554400003" for 3 entries of "...446655440000"),
and a name holding a line break printed a line of its own that read as another namespace."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm import cli
from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {}}
TENANT = "550e8400-e29b-41d4-a716-446655440000"


def _fill(path: Path, names: dict[str, int]) -> None:
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder()) as cache:
        for ns, n in names.items():
            for i in range(n):
                cache.put([{"role": "user", "content": f"question {i}"}], "answer", namespace=ns, **KW)


def _namespace_lines(path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert cli.main(["cache", "stats", "--path", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    return out[out.index(next(line for line in out if line.startswith("verifier:"))) + 1 :]


def test_a_long_namespace_is_kept_apart_from_its_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.sqlite3"
    _fill(path, {TENANT: 3, "alice": 2})
    lines = _namespace_lines(path, capsys)
    assert [line.split() for line in lines] == [[TENANT, "3"], ["alice", "2"]]
    # the counts stand in one column
    assert len({line.rindex(" ") for line in lines}) == 1


def test_a_namespace_with_a_line_break_is_shown_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.sqlite3"
    _fill(path, {"acme\nbob": 1})
    lines = _namespace_lines(path, capsys)
    assert len(lines) == 1
    assert lines[0].split() == ["'acme\\nbob'", "1"]
