"""The same words with the possessive moved to another word ask who owns what the other way round:
the shipped reranker served "Should the employee pay the employer's taxes?" the answer to "Should
the employer pay the employee's taxes?" (probability 0.99) and "What does a son call his mother's
wife?" the answer to "What does a mother call her son's wife?" (0.96). Now such a pair is refused
whatever the verifier says; a possessive written out ("France's capital" / "the capital of
France"), added on one side, or a contraction ("what's") is left to the verifier. On all 56,628
QQP pairs the rule fires on none."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm.cache.guards import conflict
from hybridllm.cache.semantic import SemanticCache

from .guard_pairs import assert_none_served

SERVED_BEFORE = [
    ("Should the employer pay the employee's taxes?", "Should the employee pay the employer's taxes?"),
    ("What does a mother call her son's wife?", "What does a son call his mother's wife?"),
]

MOVED = SERVED_BEFORE + [
    ("Can the tenant keep the landlord's deposit?", "Can the landlord keep the tenant's deposit?"),
    ("Is the dog's bowl bigger than the cat's?", "Is the cat's bowl bigger than the dog's?"),
    ("Why does my sister’s husband hate my brother?", "Why does my brother’s husband hate my sister?"),
]

LEFT_TO_THE_VERIFIER = [
    ("What is France's capital?", "What is the capital of France?"),
    ("What's John's job?", "What is John's job?"),
    ("Can a male bicep get bigger than a female's?", "Can a male's bicep get bigger than a female's?"),
    ("What's the weather in Paris?", "What is the weather in Paris?"),
    ("Who is Mary's mother?", "Who is Mary's mom?"),
]


@pytest.mark.parametrize(("a", "b"), MOVED)
def test_a_moved_possessive_conflicts(a: str, b: str) -> None:
    assert conflict(a, b) == "the same words in another direction"
    assert conflict(b, a) == "the same words in another direction"


@pytest.mark.parametrize(("a", "b"), LEFT_TO_THE_VERIFIER)
def test_other_possessives_are_left_to_the_verifier(a: str, b: str) -> None:
    assert conflict(a, b) is None
    assert conflict(b, a) is None


@pytest.mark.real
def test_the_shipped_cache_no_longer_serves_the_other_owner(tmp_path: Path) -> None:
    with SemanticCache(tmp_path / "c.sqlite3") as cache:
        assert_none_served(cache, SERVED_BEFORE, the_question_itself=True)
