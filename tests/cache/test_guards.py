"""The rules a hit must pass whatever the verifier says, and the exact-repeat key."""

from __future__ import annotations

import pytest

from hybridllm.cache.guards import conflict, exact_key, is_code_like

LOOP_A = "What does this print?\nfor i in range(3):\n    print(i)\nprint('done')"
LOOP_B = "What does this print?\nfor i in range(3):\n    print(i)\n    print('done')"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How do I learn Python?", "  how do i   learn python"),
        ("Tell me a joke!", "tell me a joke"),
        ("What is the capital of France?", "What is the capital of France ?"),
        ("What is 2+3?", "What is 2+3"),
        (LOOP_A, LOOP_A + "\n\n"),
        ("x = 1  \ny = 2", "x = 1\ny = 2"),  # trailing spaces of a line
    ],
)
def test_exact_key_ignores_what_never_changes_a_question(a: str, b: str) -> None:
    assert exact_key(a) == exact_key(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is 5!", "What is 5?"),  # 120, or 5
        ("what is 10!", "what is 10"),
        (LOOP_A, LOOP_B),  # prints 'done' once, or three times
        ("Is x = 1 or X = 1 valid Python?", "is x = 1 or x = 1 valid python?"),
        ("What is `A`?", "What is `a`?"),
    ],
)
def test_exact_key_keeps_what_can_change_the_answer(a: str, b: str) -> None:
    """Before: case, all whitespace and a trailing '!' were dropped, so these were one entry and
    each was served the other's answer without even running the verifier."""
    assert exact_key(a) != exact_key(b)


@pytest.mark.parametrize(
    ("a", "b", "reason"),
    [
        ("convert 5 km to miles", "convert 50 km to miles", "numbers"),
        ("How many calories are in 100g of rice?", "How many calories are in 200g of rice?", "numbers"),
        ("Summarize this in one sentence", "Summarize this in five sentences", "numbers"),
        ("Is ibuprofen safe during pregnancy?", "Is ibuprofen not safe during pregnancy?", "negation"),
        ("Why can't I sleep at night?", "Why can I sleep at night?", "negation"),
        ("Is it safe to eat raw chicken?", "Is it unsafe to eat raw chicken?", "opposite"),
        ("Is it legal to record a phone call?", "Is it illegal to record a phone call?", "opposite"),
        ("Flights from Paris to London", "Flights from London to Paris", "direction"),
        ("Is a dolphin bigger than a shark?", "Is a shark bigger than a dolphin?", "direction"),
        ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?", "direction"),
        ("What is 10-3?", "What is 3-10?", "exact repeat"),
        (LOOP_A, LOOP_B, "exact repeat"),
        ("Is x = 1 or X = 1 valid Python?", "is x = 1 or x = 1 valid python?", "exact repeat"),
    ],
)
def test_conflicts_rule_out_different_questions(a: str, b: str, reason: str) -> None:
    assert reason in (conflict(a, b) or "") and reason in (conflict(b, a) or "")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is the best way to learn Python?", "What's the best way to learn Python?"),
        ("How do I learn Python?", "how do i learn python"),
        ("What is the difference between PHP and Node.js?", "What is the Difference between Node.js and PHP"),
        ("How are waves formed?", "How waves are formed?"),
        ("Which one is better, tea or coffee?", "Which is better, tea or coffee?"),
        ("How to get rid of 10 pounds?", "How do I lose 10 pounds?"),
    ],
)
def test_paraphrases_are_left_to_the_verifier(a: str, b: str) -> None:
    assert conflict(a, b) is None


def test_what_looks_like_code() -> None:
    for text in ("x = 1", "a\nb", "use `ls`", "if (a < b) {}", "2*3", "10 / 2", "a | b", "C:\\temp"):
        assert is_code_like(text), text
    for text in ("How do I learn Python?", "What is GDP (gross domestic product)?", "Is 5 prime?",
                 "What's the best 4K TV under $500?", "How long is a 5-minute mile pace?"):
        assert not is_code_like(text), text
