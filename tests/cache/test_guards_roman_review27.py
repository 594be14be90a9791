"""Roman numerals written in capital letters ("Henry VIII" / "Henry VII", "Louis XIV" / "Louis
XVI"): the numbers guard counted the numeral signs ("Ⅲ" / "Ⅳ") but not these, and the shipped
``"features"`` verifier served "Who was Henry VII?" the answer to "Who was Henry VIII?"
(probability 0.97). Now two questions that both hold such a numeral, and not the same ones, are
refused. A lone "I" is the pronoun and is not read as one; on all 56,628 QQP pairs the rule fires
on one pair not refused before ("Civ IV or Civ V" / "civs in CIV IV", labelled different)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm.cache.guards import conflict
from hybridllm.cache.semantic import SemanticCache

DIFFERENT = [
    ("Who was Henry VIII?", "Who was Henry VII?"),
    ("Who was Louis XIV?", "Who was Louis XVI?"),
    ("Summarize Star Wars Episode IV", "Summarize Star Wars Episode V"),
    ("Who won Super Bowl XLIX?", "Who won Super Bowl XLVIII?"),
    ("What is a Type II error?", "What is a Type III error?"),
]

SAME_OR_ONE_SIDED = [
    ("Who was Henry VIII?", "Who was King Henry VIII of England?"),
    ("I love Python, how do I learn it?", "How do I learn Python?"),
    ("Who was Pope John Paul II?", "Who was John Paul II?"),
    ("What is the VIX index?", "What does the VIX measure?"),
]


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_different_roman_numerals_conflict(a: str, b: str) -> None:
    assert conflict(a, b) == "different numbers"
    assert conflict(b, a) == "different numbers"


@pytest.mark.parametrize(("a", "b"), SAME_OR_ONE_SIDED)
def test_the_same_numeral_or_none_is_left_to_the_verifier(a: str, b: str) -> None:
    assert conflict(a, b) is None
    assert conflict(b, a) is None


@pytest.mark.real
def test_the_feature_verifier_no_longer_serves_henry_viii_for_henry_vii(tmp_path: Path) -> None:
    with SemanticCache(tmp_path / "c.sqlite3", verifier="features") as cache:
        cache.put([{"role": "user", "content": "Who was Henry VIII?"}], "The Tudor king with six wives.",
                  model="m", params_key={})
        asked = [{"role": "user", "content": "Who was Henry VII?"}]
        assert cache.get(asked, model="m", params_key={}) is None
        hit = cache.get([{"role": "user", "content": "who was henry VIII"}], model="m", params_key={})
        assert hit is not None and hit.text == "The Tudor king with six wives."
