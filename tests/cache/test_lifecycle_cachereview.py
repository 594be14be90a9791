"""What HybridLLM puts into the semantic cache, and what `hybridllm cache` says of a broken file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hybridllm import HybridLLM, cli
from hybridllm.backends.fake import FakeBackend
from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

LONG = "one two three four five six seven eight"
EMAIL = "jane.doe@example.com"


def _rows(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT query, response FROM entries").fetchall()


def _client(path: Path, edge: FakeBackend | None = None, **cache_kw) -> HybridLLM:
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder(), **cache_kw)
    return HybridLLM(edge=edge or FakeBackend(model="edge", reply=lambda m: LONG), cache=cache)


def test_an_answer_cut_by_max_tokens_is_not_stored(tmp_path: Path) -> None:
    """Before: the three words max_tokens=3 left of the answer were stored, and the same question
    asked again was served them from the cache with finish_reason "stop", as a whole answer."""
    path = tmp_path / "c.sqlite3"
    llm = _client(path)
    cut = llm.chat("count for me", max_tokens=3)
    again = llm.chat("count for me", max_tokens=3)
    assert (cut.finish_reason, cut.text) == ("length", "one two three")
    assert (again.route, again.finish_reason) == ("edge", "length")
    assert _rows(path) == []
    whole = llm.chat("count for me")  # a whole answer is stored and replayed as one
    assert whole.finish_reason == "stop" and llm.chat("count for me").route == "cache"
    assert _rows(path) == [("count for me", LONG)]
    llm.close()


def test_a_stream_cut_by_max_tokens_is_not_stored(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    llm = _client(path)
    chunks = list(llm.stream("count for me", max_tokens=2))
    assert chunks[-1].finish_reason == "length"
    assert _rows(path) == []
    llm.close()


def test_personal_data_is_not_stored_by_a_client_without_a_cloud(tmp_path: Path) -> None:
    """Before: with no cloud the plan step runs no privacy scan, so a prompt holding an e-mail
    address (answer included) was written to the cache file in clear, although store_pii is off."""
    path = tmp_path / "c.sqlite3"
    llm = _client(path, edge=FakeBackend(model="edge"))  # echoes the question
    private = llm.chat(f"Write a short note to {EMAIL} about lunch")
    assert private.route == "edge"
    assert EMAIL not in path.read_bytes().decode("latin-1")
    assert _rows(path) == []
    llm.chat("What is a lunch note?")  # no personal data: stored as before
    assert [q for q, _ in _rows(path)] == ["What is a lunch note?"]
    llm.close()


def test_store_pii_still_stores_personal_data_without_a_cloud(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    llm = _client(path, edge=FakeBackend(model="edge"), store_pii=True)
    llm.chat(f"Write a short note to {EMAIL}")
    assert llm.chat(f"Write a short note to {EMAIL}").route == "cache"
    llm.close()


def test_stats_on_a_corrupt_file_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], recwarn: pytest.WarningsRecorder
) -> None:
    """Before: the rebuild's RuntimeWarning reached the user as Python prints warnings, with the
    source file, line number and a line of our code under it."""
    path = tmp_path / "c.sqlite3"
    path.write_bytes(b"SQLite format 3\x00" + b"not a database" * 400)  # damaged, not foreign
    assert cli.main(["cache", "stats", "--path", str(path)]) == 0
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: The cache database")
    assert "corrupt" in lines[0] and "RuntimeWarning" not in out.err and ".py:" not in out.err
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    aside = [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes().endswith(b"not a database")  # kept aside
    assert "entries:     0" in out.out


@pytest.mark.real
def test_a_real_model_s_answer_cut_by_max_tokens_is_not_stored(tmp_path: Path, smollm2_path) -> None:
    """SmolLM2 through llama.cpp: an answer cut at 4 tokens is not cached, a whole one is."""
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    path = tmp_path / "c.sqlite3"
    edge = LlamaCppBackend(str(smollm2_path), n_ctx=512, n_threads=1)
    llm = _client(path, edge=edge)
    ask = "Write a long story about a dragon."
    cut = llm.chat(ask, max_tokens=4, temperature=0.0)
    assert cut.finish_reason == "length" and cut.route == "edge"
    assert llm.chat(ask, max_tokens=4, temperature=0.0).route == "edge"
    assert _rows(path) == []
    whole = llm.chat("Say yes.", max_tokens=64, temperature=0.0)
    assert whole.finish_reason == "stop"
    assert llm.chat("Say yes.", max_tokens=64, temperature=0.0).route == "cache"
    llm.close()
