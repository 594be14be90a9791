"""A quoted literal in other capitals: "Reverse the string 'AbC'" and "Reverse the string 'abc'"
had one exact key (case does not count in a plain question), so the answer "cba" was served for
'AbC' as an exact repeat, and the models, which read lower case only, could not have told them
apart either. Now a quoted text keeps its case in the key where a capital follows a letter ("AbC",
"camelCase", "NASA": a literal), and the guards refuse such a pair; a quoted title or phrase typed
in other capitals ("Think and Grow Rich" / "Think and Grow rich") is one question, as before.

On QQP (99,759 questions, 56,628 pairs) 97 questions get another exact key (no pair of them had one
key before), and the rule refuses 3 pairs ("'Get Jio SIM'" / "'get Jio sim'"), none of which the
default verifier served."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm.cache.guards import conflict, exact_key
from hybridllm.cache.semantic import SemanticCache

from .fakes import FakeEmbedder
from .guard_pairs import assert_none_served

KW = {"model": "m", "params_key": {}}

# each was served as an exact repeat of the other, 2026-12-06
RECASED = [
    ("Reverse the string 'AbC'", "Reverse the string 'abc'"),
    ('How many capital letters are in "HeLLo WoRLD"?', 'How many capital letters are in "hello world"?'),
    ('Convert "camelCase" to snake case', 'Convert "camelcase" to snake case'),
    ('Is "SeCret" the same password as "secret"?', 'Is "secret" the same password as "SeCret"?'),
    ("Reverse the string \u201cAbC\u201d", "Reverse the string \u201cABC\u201d"),
]

# one question, one key: case outside quotes, a title typed either way, an apostrophe
SAME_KEY = [
    ("How do I learn Python?", "how do i  learn python"),
    ("Is 'Think and Grow Rich' worth reading?", "is 'think and grow rich' worth reading"),
    ("What does \u201cCarpe Diem\u201d mean?", "What does \u201ccarpe diem\u201d mean"),
    ("Don't the cats' toys squeak?", "don't the CATS' toys squeak"),
]


@pytest.mark.parametrize(("a", "b"), RECASED)
def test_a_quoted_literal_in_other_capitals_is_another_question(a: str, b: str) -> None:
    assert exact_key(a) != exact_key(b)
    assert conflict(a, b) == "a quoted text in other capitals"
    assert conflict(b, a) == "a quoted text in other capitals"


@pytest.mark.parametrize(("a", "b"), SAME_KEY)
def test_case_still_does_not_count_outside_quoted_literals(a: str, b: str) -> None:
    assert exact_key(a) == exact_key(b)
    assert conflict(a, b) is None


def test_spaces_inside_quotes_count_and_outside_them_do_not() -> None:
    assert exact_key("Count the spaces in 'a  b'") != exact_key("Count the spaces in 'a b'")
    assert exact_key("Count  the spaces in 'a b'") == exact_key("count the spaces in 'a b'?")


def test_no_exact_repeat_is_served_for_a_quoted_literal_in_other_capitals(tmp_path: Path) -> None:
    with SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder()) as cache:
        cache.put([{"role": "user", "content": "Reverse the string 'AbC'"}], "CbA", **KW)
        assert cache.get([{"role": "user", "content": "Reverse the string 'abc'"}], **KW) is None
        assert cache.get_exact([{"role": "user", "content": "Reverse the string 'abc'"}], **KW) is None
        hit = cache.get([{"role": "user", "content": "reverse the string 'AbC'?"}], **KW)
        assert hit is not None and hit.text == "CbA"


@pytest.mark.real
def test_the_shipped_cache_serves_no_quoted_literal_in_other_capitals(tmp_path: Path) -> None:
    with SemanticCache(tmp_path / "c.sqlite3") as cache:
        assert_none_served(cache, RECASED)
