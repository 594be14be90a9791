"""`hybridllm cache clear --namespace` given bytes that are not UTF-8 (a shell's $'\\xff'; Python
keeps them in argv as lone surrogates) ended in "internal error: UnicodeEncodeError", as SQLite
cannot take such a string. Now it is a one-line error, and the file is left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm import cli
from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder


def test_a_namespace_that_is_not_utf8_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.sqlite3"
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder()) as cache:
        cache.put([{"role": "user", "content": "q"}], "a", model="m", params_key={}, namespace="t")
    assert cli.main(["cache", "clear", "--path", str(path), "--namespace", "t\udcff"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --namespace") and "not valid UTF-8" in err and err.count("\n") == 1
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder()) as cache:
        assert cache.stats()["namespaces"] == {"t": 1}
