"""A question turned around by one word into its opposite ("faster" / "slower", "true" / "false",
"more" / "less"): the shipped reranker served each of these with the other's answer (probabilities
0.95 to 0.96, over its threshold), and no guard ruled them out. Now a pair whose differing words,
and only they, pair up as opposites is refused whatever the verifier says; a paraphrase that words
the rest otherwise is left to the verifier."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm.cache.guards import conflict
from hybridllm.cache.semantic import SemanticCache

from .guard_pairs import assert_none_served

# each was a wrong hit of the shipped cache (real MiniLM embedder and reranker), 2026-12-04
SERVED_BEFORE = [
    ("Is Python faster than Java?", "Is Python slower than Java?"),
    ("Why is Python slower than C?", "Why is Python faster than C?"),
    ("Is Jupiter more massive than Saturn?", "Is Jupiter less massive than Saturn?"),
    ("Is it true that bats are blind?", "Is it false that bats are blind?"),
]

TURNED_AROUND = SERVED_BEFORE + [
    ("Where can I buy used books?", "Where can I sell used books?"),
    ("What attracts introverted men?", "What attracts introverted women?"),
    ("How do I zoom in on a Mac?", "How do I zoom out on a Mac?"),
    ("Is the stock market open today?", "Is the stock market closed today?"),
    ("What is the maximum speed on the autobahn?", "What is the minimum speed on the autobahn?"),
]

# an opposite among other changed words, or a word on one side only: the verifier's call, as before
LEFT_TO_THE_VERIFIER = [
    ("Is Python faster than Java?", "Is Java slower than Python, in general?"),
    ("How easy is it to start up a business in Italy?", "How hard is it to open a business in Italy?"),
    ("What is the best way to learn Python?", "How do I learn Python?"),
    ("Is coffee good for you?", "Is coffee good for your health?"),
]


@pytest.mark.parametrize(("a", "b"), TURNED_AROUND)
def test_a_word_turned_into_its_opposite_conflicts(a: str, b: str) -> None:
    assert conflict(a, b) == "a word and its opposite"
    assert conflict(b, a) == "a word and its opposite"
    # case, spacing and a trailing mark do not hide it
    assert conflict(a.upper(), "  " + b.rstrip("?")) == "a word and its opposite"


@pytest.mark.parametrize(("a", "b"), LEFT_TO_THE_VERIFIER)
def test_opposites_among_other_changes_are_left_to_the_verifier(a: str, b: str) -> None:
    assert conflict(a, b) is None
    assert conflict(b, a) is None


@pytest.mark.real
def test_the_shipped_cache_no_longer_serves_the_opposite_question(tmp_path: Path) -> None:
    with SemanticCache(tmp_path / "c.sqlite3") as cache:
        assert_none_served(cache, SERVED_BEFORE)
        # a paraphrase of a cached question is still served
        cache.put([{"role": "user", "content": "How can I improve my English?"}], "Read daily.",
                  model="m", params_key={}, namespace="para")
        hit = cache.get([{"role": "user", "content": "How do I improve my English?"}], model="m",
                        params_key={}, namespace="para")
        assert hit is not None and hit.text == "Read daily."
