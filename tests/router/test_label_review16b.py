"""Grading numbers and option letters, reading questions, and resuming a file with other columns."""

from __future__ import annotations

import json

import pytest

from hybridllm import DataError
from hybridllm.router.dataset import load_routellm_csv
from hybridllm.router.label import Answer, Question, is_correct, label_to_csv, read_questions


@pytest.mark.parametrize(
    ("answer", "reference", "want"),
    [
        # "-$5": the minus was dropped, so a loss of $5 graded as the gain
        ("He lost money. The answer is -$5.", "-5", True),
        ("The answer is 5.", "-$5", False),
        ("The answer is -5.", "-$5", True),
        ("The answer is $-5.", "-$5", True),
        # a fraction is one number: "3/4" read as 3, and a reference "3/4" compared as the word "34"
        ("The answer is 3/4.", "0.75", True),
        ("The answer is 0.75", "3/4", True),
        ("The answer is 34.", "3/4", False),
        ("The answer is 3/4 of a cup.", "3", False),
        ("The answer is 60/2, which is 30.", "30", True),
        ("The answer is 5/0.", "5", False),
        # a number without its leading zero: ".5" read as 5
        ("The answer is .5", "0.5", True),
        ("The answer is $.50", "0.5", True),
        ("The answer is 0.5", ".5", True),
        ("The answer is 5", ".5", False),
        # unchanged: commas, decimals, a unit, the final answer's number, not the last one
        ("The answer is 1,000.", "1000", True),
        ("The answer is 5.00 dollars", "5", True),
        ("The answer is 12. He had 3 before.", "12", True),
        ("The answer is 1.5", "1", False),
    ],
)
def test_numbers(answer, reference, want):
    assert is_correct(answer, reference) is want


@pytest.mark.parametrize(
    ("answer", "reference", "want"),
    [
        # a hedge naming two options was graded right for either
        ("The answer is B and C.", "B", False),
        ("The answer is B, C", "C", False),
        ("The answer is (A) or (C).", "A", False),
        ("The answer is B/D", "B", False),
        # "option B" / "choice C" after the cue was graded wrong: its first word is "option"
        ("The answer is option B.", "B", True),
        ("The answer is option (B) Paris", "B", True),
        ("The answer is choice: C", "C", True),
        ("The answer is option B.", "C", False),
        # unchanged: one letter, then words that are not options
        ("The answer is B and I am sure of it.", "B", True),
        ("The answer is B. A cat sleeps.", "B", True),
        ("The answer is (B) Paris and London", "B", True),
        ("The answer is b", "B", True),
        ("The answer is optional", "O", False),
        ("The answer is yes and no", "yes", True),
    ],
)
def test_letters(answer, reference, want):
    assert is_correct(answer, reference) is want


def _write(tmp_path, rec) -> str:
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "rec",
    [
        {"question": "   ", "answer": "#### 5"},  # a blank question: a row of noise for the router
        {"question": "2 + 2?", "answer": "Add them. #### "},  # nothing after the marker: all graded wrong
    ],
)
def test_a_blank_question_or_reference_is_refused(tmp_path, rec):
    with pytest.raises(DataError, match="line 1 needs"):
        read_questions(_write(tmp_path, rec))


@pytest.mark.parametrize(
    ("rec", "reference"),
    [
        ({"question": "2 - 2?", "final": 0, "answer": "Subtract."}, "0"),  # a final of 0 was passed over
        ({"question": "3 + 4?", "answer": None, "reference": "7"}, "7"),  # a null answer was refused
    ],
)
def test_the_first_reference_given_is_used(tmp_path, rec, reference):
    assert read_questions(_write(tmp_path, rec))[0].reference == reference


def _right(prompt: str) -> Answer:
    return Answer(text=f"The answer is {2 * int(prompt.split()[2])}", mean_logprob=-0.25, num_tokens=5)


@pytest.mark.parametrize("header", ["prompt,edge:a,cloud:b", "prompt,edge:a,cloud:b,edge_mean_logprob"])
def test_a_file_with_fewer_columns_resumes_with_its_own_and_still_loads(tmp_path, header):
    """A file with the model columns only (as RouteLLM's, or one without ``cloud_tokens``) got rows
    of five cells under its header: `router train` then refused every row added."""
    out = tmp_path / "labels.csv"
    n = header.count(",") + 1
    out.write_bytes((header + "\r\nWhat is 0 + 0?,True,False" + ",-0.5" * (n - 3) + "\r\n").encode())
    questions = [Question(f"What is {i} + {i}?", str(2 * i)) for i in range(3)]
    run = label_to_csv(questions, _right, _right, out, edge_col="edge:a", cloud_col="cloud:b")
    assert (run.num_skipped, run.num_added, run.num_rows) == (1, 2, 3)
    lines = out.read_bytes().decode().splitlines()
    assert lines[0] == header and all(line.count(",") == n - 1 for line in lines)
    assert "What is 1 + 1?,True,True" + ",-0.25000" * (n - 3) in lines
    data = load_routellm_csv(out, weak_col="edge:a", strong_col="cloud:b")
    assert sorted(data.prompts) == [f"What is {i} + {i}?" for i in range(3)]
