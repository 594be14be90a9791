"""A request for a brief answer and one for a detailed answer of the same topic ("Briefly explain
how vaccines work" / "Explain in detail how vaccines work"), or such a request on one side only
("Summarize the Iliad" / "... in detail"): the shipped reranker served each of these with the
other's answer (probabilities 0.95 to 0.97, over its threshold), since the models read the topic,
which is the same. So were three pairs turned around by one word the opposites list lacked: "for" /
"against", "simple" / "technical", "speed up" / "slow down" (the last one listed in the README as a
known wrong answer). Now the guards refuse them whatever the verifier says; paraphrases that ask
for the same length, and content words such as "quickly" or "depth", are left to the verifier.

On QQP (56,628 pairs, text_a cached and text_b asked, as ``hybridllm cache eval`` asks) these rules
refuse 57 pairs the guards let through before (27 labelled the same question, 30 different); the
default verifier served 5 of them: 4 labelled the same (now misses) and 1 labelled different,
"arguments for" / "against virtue ethics" (now refused)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm.cache.guards import conflict
from hybridllm.cache.semantic import SemanticCache

from .guard_pairs import assert_none_served

# each was a wrong hit of the shipped cache (real MiniLM embedder and reranker), 2026-12-06
LENGTH_SERVED_BEFORE = [
    ("Briefly explain how vaccines work", "Explain in detail how vaccines work"),
    ("Explain quantum computing briefly", "Explain quantum computing in detail"),
    ("Give me a brief overview of the Roman Empire", "Give me a comprehensive overview of the Roman Empire"),
    ("Give me a quick summary of the Iliad", "Give me a detailed summary of the Iliad"),
    ("Summarize the Iliad", "Summarize the Iliad in detail"),
    ("Explain how vaccines work", "Explain in detail how vaccines work"),
    ("Explain how vaccines work", "Briefly explain how vaccines work"),
    ("Give me an overview of the Roman Empire", "Give me a comprehensive overview of the Roman Empire"),
]
OPPOSITES_SERVED_BEFORE = [
    ("Give me arguments for nuclear power", "Give me arguments against nuclear power"),
    ("Explain black holes in simple terms", "Explain black holes in technical terms"),
    ("How do I speed up my computer?", "How do I slow down my computer?"),
]

# the same length asked for in other words, or words that are not about the answer's length
LEFT_TO_THE_VERIFIER = [
    ("Briefly explain how vaccines work", "Explain briefly how vaccines work"),
    ("Give me a short summary of the Iliad", "Summarize the Iliad briefly"),
    ("Explain in detail how vaccines work", "Give me a detailed explanation of how vaccines work"),
    ("How quickly does hair grow?", "How fast does hair grow?"),
    ("What is the depth of the Mariana Trench?", "How deep is the Mariana Trench?"),
    ("Is it a short-term investment?", "Is it a short term investment?"),
]


@pytest.mark.parametrize(("a", "b"), LENGTH_SERVED_BEFORE)
def test_another_length_of_answer_conflicts(a: str, b: str) -> None:
    assert conflict(a, b) == "another length of answer asked for"
    assert conflict(b, a) == "another length of answer asked for"
    assert conflict(a.upper(), "  " + b) == "another length of answer asked for"


@pytest.mark.parametrize(("a", "b"), OPPOSITES_SERVED_BEFORE)
def test_for_against_simple_technical_and_speed_slow_are_opposites(a: str, b: str) -> None:
    assert conflict(a, b) == "a word and its opposite"
    assert conflict(b, a) == "a word and its opposite"


@pytest.mark.parametrize(("a", "b"), LEFT_TO_THE_VERIFIER)
def test_the_same_length_or_other_words_are_left_to_the_verifier(a: str, b: str) -> None:
    assert conflict(a, b) is None
    assert conflict(b, a) is None


@pytest.mark.real
def test_the_shipped_cache_no_longer_serves_another_length_or_the_opposite(tmp_path: Path) -> None:
    with SemanticCache(tmp_path / "c.sqlite3") as cache:
        assert_none_served(cache, LENGTH_SERVED_BEFORE + OPPOSITES_SERVED_BEFORE, the_question_itself=True)
