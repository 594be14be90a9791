"""Pairwise judgements (arena-style data) as routing labels. Each shape of the same judgements
loads to exactly the scores of the two-column file they were written from."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from hybridllm._exceptions import DataError
from hybridllm.router.dataset import load_routellm_csv

TIERS = {"strong_models": ["gpt-4*"], "weak_models": ["Mixtral-8x7B,llama-2-70b*"]}
PAIR = {"strong_models": ["gpt-4"], "weak_models": ["mixtral"]}


def _rows(n=240, seed=0):
    """Prompts with a weak and a strong model's correctness; the gain depends on the prompt."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        k = int(rng.integers(1, 60))
        weak = bool(rng.random() > k / 60)
        yield f"q{i} " + "word " * k, weak, bool(rng.random() > 0.1)


def _outcome(weak, strong):
    if weak == strong:
        return "tie" if weak else "tie (bothbad)"
    return "strong" if strong else "weak"


def _battles(rows, seed=1):
    """The rows as judged battles, the strong model on a random side, plus battles the tiers
    do not cover (two strong models; a model of neither tier)."""
    rng = np.random.default_rng(seed)
    out = []
    for i, (p, w, s) in enumerate(rows):
        strong_model = "gpt-4-0613" if i % 2 else "GPT-4-turbo"
        weak_model = "mixtral-8x7b" if i % 3 else "llama-2-70b-chat"
        sides = [strong_model, weak_model] if rng.random() < 0.5 else [weak_model, strong_model]
        o = _outcome(w, s)
        won = strong_model if o == "strong" else weak_model
        winner = o if o.startswith("tie") else "model_a" if sides[0] == won else "model_b"
        out.append({"prompt": p, "model_a": sides[0], "model_b": sides[1], "winner": winner})
        if i % 10 == 0:
            out.append({"prompt": p, "model_a": "gpt-4-0613", "model_b": "GPT-4-turbo", "winner": "model_a"})
            out.append({"prompt": p, "model_a": "vicuna-7b", "model_b": "gpt-4-0613", "winner": "tie"})
    return out


def _user(text):
    return {"role": "user", "content": text}


def _write_csv(path, header, rows):
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


def _jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def _same_scores(d, ref):
    assert d.prompts == ref.prompts
    np.testing.assert_array_equal(d.weak, ref.weak)
    np.testing.assert_array_equal(d.strong, ref.strong)


def test_winner_column_loads_as_the_two_score_columns(tmp_path):
    rows = list(_rows())
    ref = load_routellm_csv(_write_csv(tmp_path / "ref.csv", ["prompt", "weak", "strong"], rows))
    battles = _battles(rows)
    d = load_routellm_csv(_jsonl(tmp_path / "arena.jsonl", battles), **TIERS)
    _same_scores(d, ref)
    assert d.skipped == len(battles) - len(rows) == 48
    assert d.strong_col == "GPT-4-turbo, gpt-4-0613"
    assert d.weak_col == "llama-2-70b-chat, mixtral-8x7b"
    # the same file as CSV, the prompt written as arena exports do: a JSON list of user turns
    header = ["prompt", "model_a", "model_b", "winner"]
    turns = [json.dumps(["an earlier turn", b["prompt"]]) for b in battles]
    as_csv = [[t, b["model_a"], b["model_b"], b["winner"]] for t, b in zip(turns, battles, strict=True)]
    _same_scores(load_routellm_csv(_write_csv(tmp_path / "arena.csv", header, as_csv), **TIERS), ref)
    # the winner named by model rather than by side
    named = [{**b, "winner": b.get(b["winner"], b["winner"])} for b in battles]
    _same_scores(load_routellm_csv(_jsonl(tmp_path / "named.jsonl", named), **TIERS), ref)
    # the tiers swapped: every gain changes sign
    swapped = load_routellm_csv(
        tmp_path / "arena.jsonl", strong_models=TIERS["weak_models"], weak_models=["gpt-4*"]
    )
    np.testing.assert_array_equal(swapped.strong, ref.weak)
    np.testing.assert_array_equal(swapped.weak, ref.strong)


def test_indicator_columns_and_conversations(tmp_path):
    """The 0/1 columns winner_model_a, winner_model_b, winner_tie (no 'both bad' outcome: a tie
    scores both sides 1), and the prompt taken from conversation_a's last user turn."""
    rows = list(_rows(60))
    battles = [b for b in _battles(rows) if b["winner"] != "tie (bothbad)"]
    records = []
    for b in battles:
        records.append(
            {
                "model_a": b["model_a"],
                "model_b": b["model_b"],
                "conversation_a": [_user(b["prompt"]), {"role": "assistant", "content": "x"}],
                "conversation_b": [_user(b["prompt"]), {"role": "assistant", "content": "y"}],
                "winner_model_a": int(b["winner"] == "model_a"),
                "winner_model_b": int(b["winner"] == "model_b"),
                "winner_tie": int(b["winner"] == "tie"),
            }
        )
    d = load_routellm_csv(_jsonl(tmp_path / "flags.jsonl", records), **TIERS)
    plain = load_routellm_csv(_jsonl(tmp_path / "plain.jsonl", battles), **TIERS)
    assert d.prompt_col == "conversation_a"
    _same_scores(d, plain)
    records[3]["winner_model_b"] = 1
    records[3]["winner_model_a"] = 1
    with pytest.raises(DataError, match="row 4: more than one of winner_model_a"):
        load_routellm_csv(_jsonl(tmp_path / "two.jsonl", records), **TIERS)


def test_a_fixed_pair_without_model_columns(tmp_path):
    path = _write_csv(
        tmp_path / "pair.csv",
        ["prompt", "winner"],
        [["a", "gpt-4"], ["b", "mixtral"], ["c", "tie"], ["d", "tie (bothbad)"], ["e", ""], ["f", "claude"]],
    )
    d = load_routellm_csv(path, strong_models=["gpt-4"], weak_models=["mixtral"])
    assert d.prompts == ["a", "b", "c", "d"] and d.skipped == 2
    assert list(d.strong) == [1, 0, 1, 0] and list(d.weak) == [0, 1, 1, 0]
    assert list(d.labels) == [1, 0, 0, 0]
    side = _write_csv(tmp_path / "side.csv", ["prompt", "winner"], [["a", "model_a"]])
    with pytest.raises(DataError, match="no model_a and model_b columns"):
        load_routellm_csv(side, strong_models=["gpt-4"], weak_models=["mixtral"])


def test_judgement_errors_say_what_to_do(tmp_path):
    battles = _battles(list(_rows(30)))
    path = _jsonl(tmp_path / "arena.jsonl", battles)
    with pytest.raises(DataError, match=r"--strong-models and --weak-models.*Most judged: gpt-4-0613 \("):
        load_routellm_csv(path)
    with pytest.raises(DataError, match="'gpt-4-0613' matches both"):
        load_routellm_csv(path, strong_models=["gpt-4*"], weak_models=["*-0613"])
    with pytest.raises(DataError, match="No judgement .* is between"):
        load_routellm_csv(path, strong_models=["claude*"], weak_models=["mixtral*"])
    # a file with both: named score columns are read as scores, the judgements left aside
    both = _jsonl(tmp_path / "both.jsonl", [{**b, "w": 0.5, "s": 1.0} for b in battles])
    d = load_routellm_csv(both, weak_col="w", strong_col="s")
    assert (d.weak_col, d.strong_col, len(d.prompts)) == ("w", "s", len(battles))
    odd = _jsonl(tmp_path / "odd.jsonl", [{**battles[0], "winner": "gpt-5"}])
    with pytest.raises(DataError, match="row 1: the winner 'gpt-5' is neither side"):
        load_routellm_csv(odd, **TIERS)


def test_cli_trains_and_evaluates_judgements_as_the_score_file(tmp_path, capsys):
    from hybridllm.cli import main

    rows = list(_rows(300))
    plain = _write_csv(tmp_path / "plain.csv", ["prompt", "small", "big"], rows)
    arena = _jsonl(tmp_path / "arena.jsonl", _battles(rows))
    tiers = ["--strong-models", "gpt-4*", "--weak-models", "mixtral*", "--weak-models", "llama-2-70b*"]
    outs = []
    for path, extra in ((plain, []), (arena, tiers)):
        out = tmp_path / path.stem
        args = ["router", "train", "--data", str(path), "--out", str(out), "--no-embedding", *extra]
        assert main(args) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0]["cv"] == outs[1]["cv"] and outs[0]["threshold"] == outs[1]["threshold"]
    assert outs[1]["skipped_rows"] == {"arena.jsonl": 60}
    assert outs[1]["columns"]["arena.jsonl"]["strong"] == "GPT-4-turbo, gpt-4-0613"
    info = json.loads((tmp_path / "arena" / "router.json").read_text())["training"]
    want = "--strong-models 'gpt-4*' --weak-models 'mixtral*' --weak-models 'llama-2-70b*'"
    assert want in info["command"]
    ev_args = ["router", "eval", "--data", str(arena), "--router", str(tmp_path / "plain")]
    assert main([*ev_args, "--json", *tiers]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["n"] == 300 and ev["trained_on_this_data"] is True and ev["skipped_rows"] == 60
    # without the tiers: an error naming the options, not a traceback
    assert main(ev_args) == 1
    assert "--strong-models" in capsys.readouterr().err
    # tiers given for files without judgements
    args = ["router", "train", "--data", str(plain), "--out", str(tmp_path / "x"), "--no-embedding", *tiers]
    assert main(args) == 1
    assert "no --data file has one" in capsys.readouterr().err


def test_names_match_as_the_tiers_do_and_a_note_column_is_not_judgements(tmp_path):
    """Model names are compared without surrounding spaces and in any case, as the tier globs
    are; a score file whose 'winner' column is a note loads by its scores without tiers."""
    fixed = _write_csv(
        tmp_path / "f.csv", ["prompt", "winner"], [["q1", "gpt-4"], ["q2", "mixtral "], ["q3", " GPT-4"]]
    )
    d = load_routellm_csv(fixed, strong_models=["gpt-4"], weak_models=["mixtral"])
    assert d.skipped == 0 and list(d.strong) == [1, 0, 1] and list(d.weak) == [0, 1, 0]
    sides = _jsonl(
        tmp_path / "s.jsonl",
        [
            {"prompt": "q1", "model_a": "gpt-4 ", "model_b": "Mixtral", "winner": "GPT-4"},
            {"prompt": "q2", "model_a": "mixtral", "model_b": "gpt-4", "winner": " mixtral "},
        ],
    )
    d = load_routellm_csv(sides, strong_models=["gpt-4"], weak_models=["mixtral"])
    assert list(d.strong) == [1, 0] and list(d.weak) == [0, 1]
    # without model columns a file judges one pair: two strong models among the winners is refused
    two = _write_csv(tmp_path / "two.csv", ["prompt", "winner"], [["q1", "gpt-4"], ["q2", "gpt-4-turbo"]])
    with pytest.raises(DataError, match="must judge one fixed pair.*2 strong models"):
        load_routellm_csv(two, strong_models=["gpt-4*"], weak_models=["mixtral"])
    note = _write_csv(
        tmp_path / "note.csv", ["prompt", "mixtral", "gpt4", "winner"], [["q1", "False", "True", "gpt4"],
                                                                         ["q2", "True", "True", "tie"]]
    )
    d = load_routellm_csv(note)
    assert (d.weak_col, d.strong_col) == ("mixtral", "gpt4")


def test_conversation_cells_as_pandas_writes_them_and_broken_emoji(tmp_path):
    """A CSV conversation cell in Python's list syntax (pandas' to_csv of a column of message lists)
    is read as a conversation, never as text holding the judged answers; half an emoji in a JSON
    escape is replaced, and the prompt embeds."""
    from hybridllm.router.features import embed_texts

    turns = [("user", "first question"), ("assistant", "ANSWER A"), ("user", "follow-up")]
    conv = repr([{"content": text, "role": role} for role, text in turns])
    path = _write_csv(
        tmp_path / "pd.csv",
        ["conversation_a", "model_a", "model_b", "winner"],
        [[conv, "gpt-4", "mixtral", "model_a"], [json.dumps(["bad \ud83d"]), "gpt-4", "mixtral", "tie"]],
    )
    d = load_routellm_csv(path, **PAIR)
    assert d.prompts[0] == "follow-up" and "ANSWER" not in d.prompts[0]
    assert d.prompts[1] == "bad \ufffd"
    # a prompt string as written (a CSV cell) keeps it; the embedder reads it as U+FFFD
    np.testing.assert_array_equal(embed_texts(["bad \ud83d"]), embed_texts(["bad \ufffd"]))
    chats = _jsonl(
        tmp_path / "c.jsonl",
        [{"messages": [{"role": "user", "content": "x \ud83d"}], "model_a": "gpt-4", "model_b": "mixtral",
          "winner": "tie"}],
    )
    assert load_routellm_csv(chats, **PAIR).prompts == ["x \ufffd"]
