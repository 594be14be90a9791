"""bench.quality's held-out split and its token column, on small files (no training, no data)."""

from __future__ import annotations

import numpy as np

from bench import quality
from hybridllm.router.dataset import load_routellm_csv
from hybridllm.router.train import fold_ids


def _twin_across_files() -> tuple[str, str]:
    """A question whose two spellings (case and spacing) hash to different held-out sides."""
    for i in range(1000):
        a = f"What is {i} plus {i}?"
        b = f"  what IS {i} plus  {i}? "
        ha = fold_ids([a], quality.NUM_FOLDS, salt=quality.SALT)[0] == 0
        hb = fold_ids([b], quality.NUM_FOLDS, salt=quality.SALT)[0] == 0
        if ha != hb:
            return a, b
    raise AssertionError("no such pair")


def test_a_question_in_two_files_is_held_out_in_both_or_neither():
    a, b = _twin_across_files()
    mmlu = [a, "Name a prime.", "Why is the sky blue?"]
    ours = ["How many legs has a cat?", b]
    held_mmlu, held_ours = quality.held_out_masks([mmlu, ours])
    assert held_mmlu[0] == held_ours[1]  # the router trains on neither copy, or tests on neither
    # within one file the split is the training folds' own (fold 0, salted)
    assert np.array_equal(held_ours[:1], fold_ids(ours[:1], quality.NUM_FOLDS, salt=quality.SALT)[:1] == 0)
    assert [len(m) for m in (held_mmlu, held_ours)] == [3, 2]


def test_cloud_tokens_follow_the_rows_the_loader_keeps(tmp_path):
    path = tmp_path / "pairs.csv"
    rows = [
        ("q one", "True", "True", "11"),
        ("q two", "", "True", "22"),  # the edge answer was not labelled: the loader drops the row
        ("q three", "False", "True", "33"),
        ("q four", "False", "", "44"),
        ("q five", "False", "False", ""),
    ]
    path.write_text(
        "prompt,edge:a,cloud:b,cloud_tokens\n" + "".join(",".join(r) + "\n" for r in rows), encoding="utf-8"
    )
    data = load_routellm_csv(path)
    assert data.prompts == ["q one", "q three", "q five"]
    tokens = quality._cloud_tokens(path)
    assert len(tokens) == len(data.prompts)  # before: 5 values against 3 questions
    assert tokens[:2].tolist() == [11.0, 33.0] and np.isnan(tokens[2])


def test_cloud_tokens_of_a_fully_labelled_file_are_the_column(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text("prompt,edge:a,cloud:b,cloud_tokens\nx,0,1,5\ny,1,1,7\nz,0,0,\n", encoding="utf-8")
    tokens = quality._cloud_tokens(path)
    assert tokens[:2].tolist() == [5.0, 7.0] and np.isnan(tokens[2])
