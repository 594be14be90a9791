"""Labelling questions whose JSON escapes half an emoji."""

from __future__ import annotations

from hybridllm.router.dataset import load_routellm_csv
from hybridllm.router.label import label_to_csv, read_questions


def test_a_half_emoji_in_a_question_is_labelled_not_an_internal_error(tmp_path):
    """A JSONL question holding "\\ud83d" (an emoji cut in half, as scraped data sets hold) could not
    be written to the UTF-8 CSV: UnicodeEncodeError at that row, the run stopped, and every rerun
    stopped at the same question. Now it is labelled with U+FFFD in its place, as the training
    files' loader reads such text."""
    q = tmp_path / "q.jsonl"
    q.write_text(
        '{"question": "Smile \\ud83d: 2 + 2?", "answer": "4"}\n'
        '{"question": "3 + 3?", "answer": "6 \\udc80"}\n'
        '{"question": "1 + 1?", "answer": "2"}\n',
        encoding="utf-8",
    )
    questions = read_questions(q)
    out = tmp_path / "labels.csv"
    sums = {"2 + 2": 4, "3 + 3": 6, "1 + 1": 2}
    gen = lambda p: (next(f"The answer is {v}" for k, v in sums.items() if k in p), -0.2)  # noqa: E731
    run = label_to_csv(questions, gen, gen, out, edge_col="edge:a", cloud_col="cloud:b", concurrency=2)
    assert (run.num_added, run.num_failed) == (3, 0)
    again = label_to_csv(questions, gen, gen, out, edge_col="edge:a", cloud_col="cloud:b")
    assert (again.num_added, again.num_skipped) == (0, 3)  # resumed: nothing duplicated
    data = load_routellm_csv(out, weak_col="edge:a", strong_col="cloud:b")
    assert sorted(data.prompts) == ["1 + 1?", "3 + 3?", "Smile \ufffd: 2 + 2?"]
    assert data.weak.tolist() == [1.0, 1.0, 1.0]  # "6 \ufffd" grades as the number 6
