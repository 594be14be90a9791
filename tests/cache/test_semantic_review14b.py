"""Review 14b of the cache runtime: Unicode forms in exact keys, lookups counted once."""

from __future__ import annotations

import sqlite3
import unicodedata
from pathlib import Path

import pytest

from hybridllm._exceptions import ConfigError
from hybridllm.cache import SemanticCache
from hybridllm.cache.guards import conflict, exact_key

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}


def _msgs(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_composed_and_decomposed_accents_are_one_exact_key() -> None:
    """Before: "é" as one code point and as "e" + U+0301 gave two keys, so the same question
    was stored twice and a code question typed in the other form was never served."""
    nfc = "Where is the café Müller?"
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfc != nfd
    assert exact_key(nfc) == exact_key(nfd)
    code = "Why does `naïve = 1` fail?"
    assert conflict(unicodedata.normalize("NFD", code), code) is None
    # NFC only: a superscript stays itself ("5²" is not "52")
    assert exact_key("What is 5²?") != exact_key("What is 52?")


def test_the_guards_read_a_decomposed_question_as_the_composed_one() -> None:
    """Before: "Málaga" typed decomposed split into the words "Ma" and "laga", so the swap of
    the two cities (refused when both sides are composed) passed the guards."""
    a = "Cheap flights from Málaga to Bogotá"
    b = unicodedata.normalize("NFD", "Cheap flights from Bogotá to Málaga")
    assert conflict(a, b) == conflict(a, unicodedata.normalize("NFC", b)) is not None
    assert conflict(b, a) is not None


def test_a_question_in_the_other_unicode_form_is_one_entry_and_an_exact_hit(tmp_path: Path) -> None:
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder())
    code = "Why does `naïve = 1` fail in my café app?"  # code: served on an exact repeat only
    decomposed = unicodedata.normalize("NFD", code)
    first = cache.put(_msgs(code), "old", **KW)
    second = cache.put(_msgs(decomposed), "new", **KW)
    assert first == second  # replaced, not stored twice
    assert cache.stats()["entries"] == 1
    hit = cache.get(_msgs(code), **KW)
    assert hit is not None and hit.text == "new" and hit.similarity == 1.0
    cache.close()


def test_an_exact_repeat_gone_from_the_file_counts_one_miss(tmp_path: Path) -> None:
    """An entry deleted by a writer that logs no change (an older hybridllm, or a tool): before,
    the vanished exact repeat counted a miss and the lookup that went on counted another, so one
    lookup read as two misses (hits + misses != lookups) in this object and in the file."""
    path = tmp_path / "c.sqlite3"
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    question = _msgs("what is the capital of france")
    cache.put(question, "Paris", **KW)
    with sqlite3.connect(path) as con:
        con.execute("DELETE FROM entries")
    con.close()
    assert cache.get(question, **KW) is None
    stats = cache.stats()
    assert (stats["hits"], stats["misses"]) == (0, 1)
    assert (stats["total_hits"], stats["total_misses"]) == (0, 1)
    # the exact-only lookup counts nothing, as documented; the next get counts one miss
    assert cache.get_exact(question, **KW) is None
    assert cache.get(question, **KW, exact_checked=True) is None
    assert cache.stats()["misses"] == 2
    cache.close()


def test_a_candidate_gone_from_the_file_counts_one_miss(tmp_path: Path) -> None:
    """The same for a paraphrase found by the index whose row is gone (plain cosine)."""
    path = tmp_path / "c.sqlite3"
    cache = SemanticCache(path, verifier=None, min_similarity=0.5, embedder=FakeEmbedder())
    cache.put(_msgs("what is the capital of france"), "Paris", **KW)
    with sqlite3.connect(path) as con:
        con.execute("DELETE FROM entries")
    con.close()
    assert cache.get(_msgs("what is the capital of france please"), **KW) is None
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["total_misses"]) == (0, 1, 1)
    cache.close()


@pytest.mark.parametrize("bad", [float("nan"), 1.5, -2, "0.9", "high", True])
def test_a_min_similarity_that_is_no_cosine_is_refused(tmp_path: Path, bad) -> None:
    """Before: NaN or 1.5 was taken, and the cache silently never hit; "0.9" was taken as a
    number, "high" raised a bare ValueError. The same check ttl_s has."""
    with pytest.raises(ConfigError, match="min_similarity"):
        SemanticCache(tmp_path / "c.sqlite3", verifier=None, min_similarity=bad, embedder=FakeEmbedder())


@pytest.mark.parametrize("ok", [-1, 0, 0.5, 1.0])
def test_a_min_similarity_in_range_is_kept(tmp_path: Path, ok) -> None:
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, min_similarity=ok, embedder=FakeEmbedder())
    assert cache.min_similarity == float(ok)
    cache.close()
