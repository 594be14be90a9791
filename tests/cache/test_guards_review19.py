"""Number words that also mean something else ("one", "first", "second", "zero") and questions in
another script are different questions too, whatever the verifier says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hybridllm.cache import SemanticCache
from hybridllm.cache.guards import conflict

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}


class _YesVerifier:
    """A verifier that calls every pair the same question: only the guards stand in the way."""

    kind = "yes"
    threshold = 0.5
    min_similarity = -1.0

    def predict(self, queries, cached, q_vecs, c_vecs, *, at_least=None):
        return np.ones(len(queries))


SCRIPT = "another language (another script)"
DIFFERENT = [
    # "one" counts when both sides use it: 2 is not 3
    ("What is one plus one?", "What is one plus one plus one?", "different numbers"),
    # ordinals that are also other words count when both sides hold one
    ("What caused the first world war?", "What caused the second world war?", "different numbers"),
    ("Who won the first season of Survivor?", "Who won the second season of Survivor?", "different numbers"),
    ("What is zero factorial?", "What is one factorial?", "different numbers"),
    # the same question in another script is asked in another language: an English answer is
    # no answer to it
    ("Какая столица Франции?", "What is the capital of France?", SCRIPT),
    ("Что такое Python?", "What is Python?", SCRIPT),
    ("フランスの首都はどこですか？", "What is the capital of France?", SCRIPT),
    ("Ποια είναι η πρωτεύουσα της Γαλλίας", "What is the capital of France?", SCRIPT),
]


@pytest.mark.parametrize(("a", "b", "reason"), DIFFERENT)
def test_these_are_different_questions(a: str, b: str, reason: str) -> None:
    assert conflict(a, b) == conflict(b, a) == reason


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Which one is better, tea or coffee?", "Which is better, tea or coffee?"),  # one side only
        ("How do I first learn Python?", "How do I learn Python?"),
        ("Wait a second, is Pluto a planet?", "Is Pluto a planet?"),
        ("What is the first step to learn Python?", "What's the first step to learn Python?"),
        ("What is 寿司 made of?", "What is sushi made of?"),  # mostly Latin letters on both sides
        ("Какая столица Франции?", "Какой город столица Франции?"),  # the same script
        ("東京の人口は？", "東京の人口はどのくらいですか？"),
    ],
)
def test_paraphrases_still_pass(a: str, b: str) -> None:
    assert conflict(a, b) is None


def test_plain_cosine_never_serves_one_plus_one_for_one_plus_one_plus_one(tmp_path: Path) -> None:
    """Before: the bag-of-words vectors of the two sit at cosine 0.976, past plain cosine's 0.95,
    and the answer "2" was served for "one plus one plus one"."""
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder())
    cache.put([{"role": "user", "content": "What is one plus one?"}], "2", **KW)
    assert cache.get([{"role": "user", "content": "What is one plus one plus one?"}], **KW) is None
    hit = cache.get([{"role": "user", "content": "what is one plus one"}], **KW)
    assert hit is not None and hit.text == "2"
    cache.close()


def test_a_question_in_another_script_is_never_served_whatever_the_verifier_says(tmp_path: Path) -> None:
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=_YesVerifier(), embedder=FakeEmbedder())
    cache.put([{"role": "user", "content": "What is the capital of France?"}], "Paris.", **KW)
    assert cache.get([{"role": "user", "content": "Какая столица Франции?"}], **KW) is None
    hit = cache.get([{"role": "user", "content": "Which city is the capital of France?"}], **KW)
    assert hit is not None and hit.text == "Paris."  # the verifier's call within one script
    cache.close()
