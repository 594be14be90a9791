"""`router label --data` takes a CSV/TSV of questions as well as JSON Lines (review 40): a CSV was
read as JSON and refused as "line 1 is not JSON", not saying JSON Lines was what it took."""

from __future__ import annotations

import pytest

from hybridllm import DataError
from hybridllm.router.label import read_questions


def test_a_csv_of_questions_is_read(tmp_path) -> None:
    f = tmp_path / "q.csv"
    f.write_text('question,answer\nWhat is 6 x 7?,42\n"Name the capital of France, please.",Paris\n')
    qs = read_questions(f)
    assert [(q.prompt, q.reference) for q in qs] == [
        ("What is 6 x 7?", "42"),
        ("Name the capital of France, please.", "Paris"),
    ]


def test_a_tsv_with_gsm8k_style_answers_keeps_the_final_number(tmp_path) -> None:
    f = tmp_path / "q.tsv"
    f.write_text('prompt\treference\nTom has 3 apples and buys 2. How many?\t"3 + 2 = 5 #### 5"\n')
    assert [(q.prompt, q.reference) for q in read_questions(f)] == [
        ("Tom has 3 apples and buys 2. How many?", "5")
    ]


def test_a_csv_row_without_a_reference_names_its_line(tmp_path) -> None:
    f = tmp_path / "q.csv"
    f.write_text("question,answer\nWhat is 6 x 7?,42\nName a colour.,\n")
    with pytest.raises(DataError, match="line 3 needs"):
        read_questions(f)


def test_a_file_that_is_neither_says_what_it_takes(tmp_path) -> None:
    f = tmp_path / "q.txt"
    f.write_text("What is 6 x 7?\n")
    with pytest.raises(DataError, match="JSON Lines .* or a CSV with a header"):
        read_questions(f)
