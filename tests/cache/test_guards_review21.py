"""Numbers written as words the guards did not know: ordinals past "tenth", decades, "dozen", and
multiples or fractions ("half", "double", "twice"). Each pair below embeds close and differs only
there; before, nothing ruled it out and the verifier alone decided."""

from __future__ import annotations

import pytest

from hybridllm.cache.guards import conflict

DIFFERENT = [
    ("Who won the eleventh Super Bowl?", "Who won the twelfth Super Bowl?"),
    ("What happened in the twentieth century?", "What happened in the nineteenth century?"),
    ("Explain the hundredth anniversary", "Explain the thousandth anniversary"),
    ("What music was popular in the eighties?", "What music was popular in the nineties?"),
    ("What troubles a woman in her forties?", "What troubles a woman in her fifties?"),
    ("How much does a dozen eggs cost?", "How much does a hundred eggs cost?"),
    ("What is half of 100?", "What is double 100?"),
    ("Is twice the dose dangerous?", "Is triple the dose dangerous?"),
    ("Should I take it once a day?", "Should I take it twice a day?"),
]

# the same word on both sides, or such a word on one side only: left to the verifier, as before
SAME = [
    ("How do I prepare for my first half marathon?", "What are some tips on training for a half marathon?"),
    ("Why do we sometimes get double vision?", "Why does one get double vision sometimes?"),
    ("What is double fertilization?", "What is double fertilization? How does double fertilization happen?"),
    ("How can I get better grades?", "What can I do to get better grades next quarter?"),
    ("Who won the eleventh Super Bowl?", "Who was the winner of the eleventh Super Bowl?"),
]


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_different_number_words_conflict(a: str, b: str) -> None:
    assert conflict(a, b) == "different numbers"
    assert conflict(b, a) == "different numbers"


@pytest.mark.parametrize(("a", "b"), SAME)
def test_shared_or_one_sided_words_do_not(a: str, b: str) -> None:
    assert conflict(a, b) is None
    assert conflict(b, a) is None
