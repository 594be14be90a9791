"""`router label --data`: a question whose reference is a list of accepted answers (TriviaQA's
aliases) was graded against the list's Python text, "['Paris', 'paris, france']", which no answer
holds: every row labelled wrong for both models, without a word. It is refused with its line."""

from __future__ import annotations

import json

import pytest

from hybridllm._exceptions import DataError
from hybridllm.router.label import read_questions


@pytest.mark.parametrize("key", ["answer", "reference", "final"])
def test_a_list_reference_is_refused_with_its_line(tmp_path, key):
    p = tmp_path / "q.jsonl"
    rows = [
        {"question": "2+2?", "answer": "4"},
        {"question": "Capital of France?", key: ["Paris", "paris, france"]},
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2: the reference answer is a list"):
        read_questions(p)


def test_a_number_reference_still_reads(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text(
        json.dumps({"question": "2+2?", "final": 4, "answer": "2+2=4\n#### 4"}) + "\n", encoding="utf-8"
    )
    assert [(q.prompt, q.reference) for q in read_questions(p)] == [("2+2?", "4")]
