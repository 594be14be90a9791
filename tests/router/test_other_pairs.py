"""A labelled file of another pair or task: roles, held-out overlap and RouteLLM's figures,
checked against an independent re-computation."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from hybridllm._exceptions import DataError
from hybridllm.router import train as train_mod
from hybridllm.router._cli import evaluate_router_on
from hybridllm.router.dataset import load_routellm_csv
from hybridllm.router.evaluate import router_metrics
from hybridllm.router.router import load_router
from hybridllm.router.train import train_from_csv


def write_csv(path, header, rows):
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def pair_rows(n, *, seed=0, weak_right=0.6, strong_right=0.85, prefix="q"):
    """Prompts whose length says when the strong model is needed (text features learn it)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        k = int(rng.integers(1, 60))
        hard = k > 30
        weak = bool(rng.random() < (weak_right - 0.3 if hard else weak_right + 0.3))
        strong = bool(rng.random() < strong_right)
        rows.append([f"{prefix}{i} " + "word " * k, weak, strong])
    return rows


# --- which column is the strong model --------------------------------------------------------

def test_column_names_say_the_roles_before_accuracy(tmp_path):
    """`router label` writes edge:<model> and cloud:<model>; where the edge model happens to be the
    more accurate one, accuracy alone made it the strong model and the router learned backwards."""
    rows = [[f"q{i}", i % 2 == 0, i % 4 != 0] for i in range(40)]  # cloud 0.5, edge 0.75
    p = write_csv(tmp_path / "pairs.csv", ["prompt", "cloud:qwen", "edge:smollm"], rows)
    d = load_routellm_csv(p)
    assert (d.weak_col, d.strong_col) == ("edge:smollm", "cloud:qwen")
    p2 = write_csv(tmp_path / "ws.csv", ["prompt", "strong_correct", "weak_correct"], rows)
    assert load_routellm_csv(p2).strong_col == "strong_correct"


def test_accuracies_too_close_to_tell_are_asked_for(tmp_path):
    """Two model columns whose accuracies differ by less than the noise: which one is strong is a
    coin flip, so the user is asked to name them (MMLU's math subjects: Mixtral 0.407, GPT-4 0.399)."""
    rng = np.random.default_rng(1)
    rows = [[f"q{i}", bool(rng.random() < 0.5), bool(rng.random() < 0.5)] for i in range(400)]
    a = np.mean([r[1] for r in rows])
    b = np.mean([r[2] for r in rows])
    assert abs(a - b) < 0.05  # the draw is a near tie
    p = write_csv(tmp_path / "tie.csv", ["prompt", "llama-3-8b", "claude-3-opus"], rows)
    with pytest.raises(DataError, match="cannot tell which model is the strong one.*--weak-col"):
        load_routellm_csv(p)
    d = load_routellm_csv(p, weak_col="llama-3-8b", strong_col="claude-3-opus")  # named: as given
    same = write_csv(tmp_path / "same.csv", ["prompt", "a", "b"], [[f"q{i}", True, True] for i in range(100)])
    with pytest.raises(DataError, match="no prompt needs the strong model"):  # not "cannot tell"
        train_from_csv(same, tmp_path / "r", use_embedding=False)
    assert d.strong_col == "claude-3-opus"
    # a clear gap still picks by accuracy, in either column order
    clear = [[f"q{i}", i % 3 == 0, i % 5 != 0] for i in range(100)]
    p2 = write_csv(tmp_path / "clear.csv", ["prompt", "claude-3-opus", "llama-3-8b"], clear)
    assert load_routellm_csv(p2).strong_col == "llama-3-8b"


def test_strong_not_better_is_refused_before_embedding(tmp_path, monkeypatch):
    """Named columns whose strong model is worse: a clear error before minutes of embedding, not
    after the whole cross-validation."""
    rows = [[r[0], r[2], r[1]] for r in pair_rows(120)]  # the strong model's column is the weak one's
    p = write_csv(tmp_path / "swapped.csv", ["prompt", "edge", "cloud"], rows)

    def no_embedding(*args, **kwargs):
        raise AssertionError("embedded before refusing the file")

    monkeypatch.setattr(train_mod, "cached_embeddings", no_embedding)
    with pytest.raises(DataError, match="not more accurate.*not swapped"):
        train_from_csv(p, tmp_path / "r", weak_col="edge", strong_col="cloud")


def test_too_few_prompts_for_the_folds_says_what_to_do(tmp_path):
    rows = [["same", False, True], ["same", True, True], ["other", False, False], ["other", False, True]]
    p = write_csv(tmp_path / "few.csv", ["prompt", "weak", "strong"], rows)
    with pytest.raises(DataError, match=r"Too few distinct prompts \(2\).*--folds"):
        train_from_csv(p, tmp_path / "r", use_embedding=False)


def test_eval_keeps_the_roles_the_router_was_trained_with(tmp_path):
    """A held-out file with the training file's columns is read with the router's roles: decided
    again by accuracy, a file where the strong model does worse swapped them and the router's
    figures were read backwards."""
    train = write_csv(tmp_path / "train.csv", ["prompt", "small", "big"], pair_rows(300))
    train_from_csv(train, tmp_path / "r", use_embedding=False)
    router_dir = tmp_path / "r"
    flipped = [[r[0], r[2], r[1]] for r in pair_rows(200, seed=5)]  # here 'big' is clearly worse
    held = write_csv(tmp_path / "held.csv", ["prompt", "small", "big"], flipped)
    with pytest.raises(DataError, match="not more accurate"):
        evaluate_router_on(str(held), str(router_dir))
    ok = write_csv(tmp_path / "ok.csv", ["prompt", "small", "big"], pair_rows(200, seed=6))
    result = evaluate_router_on(str(ok), str(router_dir))
    assert result["columns"] == {"prompt": "prompt", "weak": "small", "strong": "big"}


def test_prompt_column_in_another_case(tmp_path):
    """A spreadsheet's 'Prompt' header is the prompt column, as 'Question' already was."""
    rows = [[f"q{i}", i % 2 == 0, i % 4 != 0] for i in range(8)]
    p = write_csv(tmp_path / "sheet.csv", ["Prompt", "weak", "strong"], rows)
    d = load_routellm_csv(p)
    assert d.prompt_col == "Prompt" and d.prompts[0] == "q0"


def test_graders_words_and_semicolon_csv(tmp_path):
    """correct/incorrect and pass/fail cells are correctness; Excel's semicolon CSV reads as the
    comma one. Before, both gave "0 score model columns (none); name them with --weak-col", and
    naming them gave "not all scores"."""
    words = [[f"q{i}", "correct" if i % 2 else "incorrect", "PASS" if i % 4 else "fail"] for i in range(8)]
    d = load_routellm_csv(write_csv(tmp_path / "w.csv", ["prompt", "a", "b"], words))
    assert (d.weak_col, d.strong_col) == ("a", "b")
    assert list(d.weak) == [0, 1] * 4 and list(d.strong) == [0, 1, 1, 1] * 2
    semi = tmp_path / "semi.csv"
    semi.write_text("prompt;a;b\nq1, with a comma;True;True\nq2;False;True\n", encoding="utf-8")
    d = load_routellm_csv(semi)
    assert d.prompts == ["q1, with a comma", "q2"] and (d.weak_col, d.strong_col) == ("a", "b")
    none = write_csv(tmp_path / "none.csv", ["prompt", "notes"], [["q", "hello"]])
    with pytest.raises(DataError, match="no model score columns.*correct/incorrect"):
        load_routellm_csv(none)


# --- held-out evaluation never silently includes training questions --------------------------

def test_eval_counts_training_questions_in_a_held_out_file(tmp_path):
    rows = pair_rows(300)
    train = write_csv(tmp_path / "train.csv", ["prompt", "small", "big"], rows)
    train_from_csv(train, tmp_path / "r", use_embedding=False)
    new = pair_rows(150, seed=9, prefix="new")
    # 100 training questions, 40 of them with other case and spacing, plus 150 new ones
    seen = [[(r[0].upper() + "  ") if i < 40 else r[0], r[1], r[2]] for i, r in enumerate(rows[:100])]
    held = write_csv(tmp_path / "held.csv", ["prompt", "small", "big"], seen + new)
    result = evaluate_router_on(str(held), str(tmp_path / "r"))
    assert result["seen_in_training"] == 100
    assert result["trained_on_this_data"] is False
    assert result["unseen"]["n"] == 150
    d = load_routellm_csv(held)
    scores = load_router(tmp_path / "r").score_texts(d.prompts)
    expected = router_metrics(scores[100:], d.weak[100:], d.strong[100:])
    assert result["unseen"]["apgr"] == pytest.approx(expected["apgr"], abs=1e-4)
    assert result["unseen"]["calls_at_95"] == pytest.approx(expected["calls_at_95"], abs=1e-4)
    # the training file itself: every prompt seen
    again = evaluate_router_on(str(train), str(tmp_path / "r"))
    assert again["seen_in_training"] == 300 and again["trained_on_this_data"] is True
    assert "unseen" not in again


def test_folds_keep_case_and_spacing_twins_together():
    """Cross-validation never tests a question whose twin (other case or spacing) it trained on;
    prompts without twins keep the fold of their own text's hash."""
    import hashlib

    from hybridllm.router.train import fold_ids

    prompts = [f"Question {i}: what is {i} + {i}?" for i in range(50)]
    twins = [p.upper() for p in prompts] + ["  " + p.replace(" ", "   ") for p in prompts]
    for salt in ("", "1", "2"):
        folds = fold_ids(prompts + twins, 5, salt=salt)
        np.testing.assert_array_equal(folds[50:100], folds[:50])
        np.testing.assert_array_equal(folds[100:], folds[:50])
        alone = fold_ids(prompts, 5, salt=salt)
        raw = [int(hashlib.sha1((salt + p).encode()).hexdigest()[:12], 16) % 5 for p in prompts]
        np.testing.assert_array_equal(alone, raw)
        np.testing.assert_array_equal(folds[:50], raw)


# --- RouteLLM's figures, recomputed independently ---------------------------------------------

def _reference_metrics(scores, weak, strong):
    """The data README's definition, written out: send the top k of n prompts by score to the
    strong model, read the mean correctness for k = 0..n; APGR from the trapezoid area."""
    n = len(scores)
    order = sorted(range(n), key=lambda i: -scores[i])
    quality = []
    for k in range(n + 1):
        to_strong = set(order[:k])
        quality.append(sum(strong[i] if i in to_strong else weak[i] for i in range(n)) / n)
    w, s = sum(weak) / n, sum(strong) / n
    area = sum((quality[k] + quality[k + 1]) / 2 / n for k in range(n))

    def first(target):
        return next((k / n for k in range(n + 1) if quality[k] >= target - 1e-12), 1.0)

    return {
        "apgr": (area - w) / (s - w),
        "cpt50": first(w + 0.5 * (s - w)),
        "cpt80": first(w + 0.8 * (s - w)),
        "calls_at_95": first(0.95 * s),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_figures_match_an_independent_recomputation(seed):
    rng = np.random.default_rng(seed)
    n = 300
    weak = (rng.random(n) < 0.55).astype(float)
    strong = np.maximum(weak, rng.random(n) < 0.6).astype(float)
    strong[rng.random(n) < 0.05] = 0.0  # the strong model sometimes breaks a weak answer
    scores = (strong - weak) * 0.3 + rng.random(n)  # informative, no ties
    got = router_metrics(scores, weak, strong)
    ref = _reference_metrics(list(scores), list(weak), list(strong))
    for key, value in ref.items():
        assert got[key] == pytest.approx(value, abs=1e-9), key
    # graded scores (a judge's marks on [0, 1]) follow the same definition
    gw, gs = rng.random(n) * 0.8, rng.random(n)
    got = router_metrics(scores, gw, gs)
    ref = _reference_metrics(list(scores), list(gw), list(gs))
    for key, value in ref.items():
        assert got[key] == pytest.approx(value, abs=1e-9), key


def test_tied_scores_are_the_mean_over_their_orders():
    """A router with few distinct scores (say topic means): the figures are the expectation over
    the order of tied prompts, which averaging many random tie-breaks approaches."""
    rng = np.random.default_rng(3)
    n = 120
    weak = (rng.random(n) < 0.5).astype(float)
    strong = np.maximum(weak, rng.random(n) < 0.5).astype(float)
    scores = rng.integers(0, 4, n).astype(float)  # four tie groups
    got = router_metrics(scores, weak, strong)
    draws = [
        _reference_metrics(list(scores + rng.random(n) * 1e-6), list(weak), list(strong)) for _ in range(300)
    ]
    assert got["apgr"] == pytest.approx(np.mean([d["apgr"] for d in draws]), abs=0.01)


# --- progress on long embedding runs ----------------------------------------------------------

def test_embedding_progress_says_how_long_is_left(monkeypatch):
    """The rate counts from the first count the bar saw: a second file's bar starts where the
    cached first file ended (600 of 1,600), and those instant counts must not shorten the estimate."""
    import io
    import time

    from hybridllm._progress import ProgressBar

    clock = {"t": 100.0}
    monkeypatch.setattr(time, "perf_counter", lambda: clock["t"])
    out = io.StringIO()
    bar = ProgressBar("embedding prompts", unit="prompts", scale=1, stream=out, quiet_for=0.0)
    bar(600, 1600)
    clock["t"] += 100.0
    bar(1000, 1600)  # 400 prompts in 100 s: 600 left take 150 s
    line = out.getvalue().splitlines()[-1]
    assert "1000/1600 prompts 4 prompts/s, 2 min 30 s left" in line
    clock["t"] += 150.0
    bar(1600, 1600)
    assert "left" not in out.getvalue().splitlines()[-1]
