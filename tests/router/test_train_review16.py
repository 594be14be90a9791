"""question_key: one str.translate per prompt, the same keys as the per-character loop it replaced."""

from __future__ import annotations

import csv
import re
import unicodedata

import pytest

from hybridllm.router import _train_folds
from hybridllm.router._train_folds import _OPERATORS, question_key

EDGE_CASES = ["a\u200bb", "x\x00y", "?", "!!", "2+2", "What is 2+2?", "Hi!", "\ud800z", "ﬁ ½ ＡＢ", "", "  ",
              "\u2028\u00ad", "\U000e0001t", "50% of 6*3", "a/b", "e\u0301t\u00e9", "中文，标点。", "🙂!"]


def _loop_key(prompt: str) -> str:
    """The implementation before: a Python loop over every character."""
    text = unicodedata.normalize("NFKC", prompt).casefold()
    cats = [unicodedata.category(c) for c in text]
    text = "".join(
        "" if k == "Cf" else " " if k[0] in "PC" and c not in _OPERATORS else c
        for c, k in zip(text, cats, strict=True)
    )
    key = " ".join(re.findall(r"\w+|[^\w\s]", text))
    return key or " ".join(prompt.split()).casefold()


@pytest.mark.parametrize("prompt", EDGE_CASES)
def test_edge_cases_keep_their_key(prompt):
    assert question_key(prompt) == _loop_key(prompt)


def test_the_mmlu_prompts_keep_their_keys(shared_data):
    csv.field_size_limit(2**31 - 1)
    with open(shared_data / "routellm" / "mmlu_responses.csv", newline="", encoding="utf-8") as fh:
        prompts = [row["prompt"] for row in csv.DictReader(fh)]
    assert len(prompts) > 9000
    assert [question_key(p) for p in prompts] == [_loop_key(p) for p in prompts]


def test_a_prompt_seen_again_costs_no_per_character_python(monkeypatch):
    prompt = "What is the capital of France? Answer: A) Paris, B) Rome. " * 50
    want = _loop_key(prompt)
    question_key(prompt)
    calls = []
    real = unicodedata.category
    monkeypatch.setattr(_train_folds.unicodedata, "category", lambda c: calls.append(c) or real(c))
    got = question_key(prompt)
    monkeypatch.undo()
    assert got == want
    # the old loop looked up every character's category on every call (fold_ids runs per salt)
    assert calls == []
