"""Labelled files in the shapes other tools write: JSON Lines, other prompt column names,
conversations as prompts. Each loads to the same data as the equivalent RouteLLM CSV."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybridllm._exceptions import DataError
from hybridllm.router.classifier import GainScorer
from hybridllm.router.dataset import file_columns, load_routellm_csv

CSV = (
    "prompt,small,big\n"
    '"What is 2+2?",True,True\n'
    '"Prove Fermat\'s little theorem.",False,True\n'
    '"Say hi",True,False\n'
    '"Name a colour",,True\n'
)


def _jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


RECORDS = [
    {"prompt": "What is 2+2?", "small": True, "big": True},
    {"prompt": "Prove Fermat's little theorem.", "small": False, "big": True},
    {"prompt": "Say hi", "small": True, "big": False},
    {"prompt": "Name a colour", "small": None, "big": True},
]


def _same(a, b):
    assert a.prompts == b.prompts
    assert (a.weak_col, a.strong_col, a.skipped) == (b.weak_col, b.strong_col, b.skipped)
    np.testing.assert_array_equal(a.weak, b.weak)
    np.testing.assert_array_equal(a.strong, b.strong)


def test_jsonl_loads_as_the_csv(tmp_path):
    ref = load_routellm_csv(_write(tmp_path / "d.csv", CSV))
    assert (ref.weak_col, ref.strong_col, ref.skipped) == ("small", "big", 1)
    _same(load_routellm_csv(_jsonl(tmp_path / "d.jsonl", RECORDS)), ref)
    # a JSON array of the same objects
    (tmp_path / "d.json").write_text(json.dumps(RECORDS), encoding="utf-8")
    _same(load_routellm_csv(tmp_path / "d.json"), ref)
    # numbers instead of booleans, and a missing key instead of null
    numeric = [
        {k: (int(v) if isinstance(v, bool) else v) for k, v in r.items() if v is not None} for r in RECORDS
    ]
    _same(load_routellm_csv(_jsonl(tmp_path / "n.jsonl", numeric)), ref)
    assert file_columns(tmp_path / "d.jsonl") == ["prompt", "small", "big"]


def test_prompt_column_by_alias_or_name(tmp_path):
    ref = load_routellm_csv(_write(tmp_path / "d.csv", CSV))
    renamed = [{("question" if k == "prompt" else k): v for k, v in r.items()} for r in RECORDS]
    d = load_routellm_csv(_jsonl(tmp_path / "q.jsonl", renamed))
    assert d.prompt_col == "question"
    _same(d, ref)
    odd = _write(tmp_path / "odd.csv", CSV.replace("prompt,", "body,", 1))
    with pytest.raises(DataError, match="--prompt-col"):
        load_routellm_csv(odd)
    _same(load_routellm_csv(odd, prompt_col="body"), ref)
    with pytest.raises(DataError, match="no column 'nope' for --prompt-col"):
        load_routellm_csv(odd, prompt_col="nope")


def test_conversation_prompts_train_on_the_last_user_turn(tmp_path):
    """The router scores a conversation's last user turn at run time, so that is what it learns."""
    convs = [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": r["prompt"]},
            ],
            "small": r["small"],
            "big": r["big"],
        }
        for r in RECORDS
    ]
    convs[1]["messages"] = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": [{"type": "text", "text": "Prove Fermat's little theorem."}]},
    ]
    ref = load_routellm_csv(_write(tmp_path / "d.csv", CSV))
    _same(load_routellm_csv(_jsonl(tmp_path / "m.jsonl", convs)), ref)
    turns = [
        {"turns": ["Earlier question", r["prompt"]], "small": r["small"], "big": r["big"]} for r in RECORDS
    ]
    _same(load_routellm_csv(_jsonl(tmp_path / "t.jsonl", turns)), ref)


def test_bad_json_files_say_where(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "x": true, "y": false}\n{"prompt": "b", "x": tru\n', encoding="utf-8")
    with pytest.raises(DataError, match="line 2 is not valid JSON"):
        load_routellm_csv(bad)
    _jsonl(bad, [{"prompt": "a", "x": True, "y": False}, ["b", True, False]])
    with pytest.raises(DataError, match="line 2 is a list"):
        load_routellm_csv(bad)
    _jsonl(
        bad,
        [
            {"prompt": "a", "x": True, "y": False},
            {"prompt": [{"role": "robot", "content": "b"}], "x": True, "y": False},
        ],
    )
    with pytest.raises(DataError, match="record 2: the prompt is a list but not a conversation"):
        load_routellm_csv(bad)
    _jsonl(bad, [{"prompt": {"text": "a"}, "x": True, "y": False}])
    with pytest.raises(DataError, match="record 1: the prompt is a dict"):
        load_routellm_csv(bad)


def test_neighbor_scores_in_slices_match_one_pass(monkeypatch):
    """Batches are scored in slices of rows (a 60,000-row file scored against itself needed 24 GB
    at once); the slices give exactly the scores of one pass and of one prompt at a time."""
    import hybridllm.router.classifier as classifier

    rng = np.random.default_rng(0)
    refs = rng.standard_normal((300, 8)).astype(np.float32)
    scorer = GainScorer(
        mean=np.zeros(1, np.float32),
        scale=np.ones(1, np.float32),
        coef=np.zeros((2, 1), np.float32),
        intercept=np.zeros(2, np.float32),
        classes=np.array([0.0, 1.0], np.float32),
        proj_mean=np.zeros(8, np.float32),
        proj=np.eye(8, dtype=np.float32),
        refs=refs,
        ref_gains=rng.integers(-1, 2, 300).astype(np.float32),
        k=7,
        mix=1.0,
    )
    emb = rng.standard_normal((50, 8)).astype(np.float32)
    whole = scorer.neighbor_gain(emb)
    monkeypatch.setattr(classifier, "_NEIGHBOR_ROWS", 16)  # 50 rows: slices of 16, 16, 16 and 2
    sliced = scorer.neighbor_gain(emb)
    one_by_one = np.concatenate([scorer.neighbor_gain(e[None]) for e in emb])
    np.testing.assert_array_equal(sliced, whole)
    np.testing.assert_array_equal(one_by_one, whole)
    assert len(np.unique(whole)) > 3  # neighbors, not a constant


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def _labelled(n=300, seed=0):
    """Prompts whose length says whether the strong model is needed (learnable without embeddings)."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        k = int(rng.integers(1, 60))
        weak = bool(rng.random() > k / 60)
        yield f"q{i} " + "word " * k, weak, bool(rng.random() > 0.1)


def test_cli_trains_and_evaluates_json_lines_as_the_csv(tmp_path, capsys):
    import csv

    from hybridllm.cli import main

    rows = list(_labelled())
    plain = tmp_path / "plain.csv"
    with plain.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([["prompt", "small", "big"], *rows])
    chats = _jsonl(
        tmp_path / "chats.jsonl",
        [
            {"conversation": [{"role": "user", "content": p}], "small": w, "big": s, "id": i}
            for i, (p, w, s) in enumerate(rows)
        ],
    )
    outs = []
    for path, extra in ((plain, []), (chats, ["--prompt-col", "conversation"])):
        out = tmp_path / path.stem
        assert (
            main(["router", "train", "--data", str(path), "--out", str(out), "--no-embedding", *extra]) == 0
        )
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0]["cv"] == outs[1]["cv"] and outs[0]["threshold"] == outs[1]["threshold"]
    assert outs[0]["cv"]["apgr"] > 0.6
    assert outs[1]["columns"] == {"chats.jsonl": {"prompt": "conversation", "weak": "small", "strong": "big"}}
    info = json.loads((tmp_path / "chats" / "router.json").read_text())["training"]
    assert "--prompt-col 'conversation'" in info["command"]
    # 'conversation' is one of the names taken as the prompt without --prompt-col
    assert main(["router", "eval", "--data", str(chats), "--router", str(tmp_path / "plain"), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["n"] == 300 and ev["trained_on_this_data"] is True
    bad = _jsonl(tmp_path / "bad.jsonl", [{"body": p, "small": w, "big": s} for p, w, s in rows])
    assert main(["router", "eval", "--data", str(bad), "--router", str(tmp_path / "plain")]) == 1
    assert "--prompt-col" in capsys.readouterr().err


def test_byte_order_mark_tab_separated_and_binary_files(tmp_path):
    ref = load_routellm_csv(_write(tmp_path / "d.csv", CSV))
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + CSV.encode())  # as Excel writes UTF-8 CSV
    _same(load_routellm_csv(bom), ref)
    tsv = tmp_path / "d.tsv"
    tsv.write_text(CSV.replace(",", "\t").replace("\t\t", "\t\t"), encoding="utf-8")
    _same(load_routellm_csv(tsv), ref)
    jbom = tmp_path / "bom.jsonl"
    jbom.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(r) for r in RECORDS).encode())
    _same(load_routellm_csv(jbom), ref)
    (tmp_path / "d.parquet").write_bytes(b"PAR1\x00\x00PAR1")
    with pytest.raises(DataError, match="parquet file; write it as CSV or JSON Lines"):
        load_routellm_csv(tmp_path / "d.parquet")


def test_one_model_graded_against_the_strong_reference(tmp_path):
    """A judge's 1-5 marks of the weak model's answers, with the strong model's as the reference
    (RouteLLM's GPT-4-judged data): the strong side scores the top of the scale."""
    path = _write(tmp_path / "judge.csv", 'prompt,mixtral_score\n"a",5\n"b",1\n"c",3\n"d",\n')
    with pytest.raises(DataError, match="one numeric model column.*--reference-strong"):
        load_routellm_csv(path, score_range=(1, 5))
    d = load_routellm_csv(path, score_range=(1, 5), reference_strong=True)
    assert (d.weak_col, d.strong_col, d.skipped) == ("mixtral_score", "(reference)", 1)
    np.testing.assert_allclose(d.weak, [1.0, 0.0, 0.5])
    np.testing.assert_array_equal(d.strong, [1.0, 1.0, 1.0])
    assert list(d.labels) == [0, 1, 1]
    # a file with both models' columns loads as it does without the option
    two = _write(tmp_path / "d.csv", CSV)
    _same(load_routellm_csv(two, reference_strong=True), load_routellm_csv(two))
    # True/False correctness of the weak model alone
    tf = _write(tmp_path / "tf.csv", 'prompt,ok\n"a",True\n"b",False\n')
    d = load_routellm_csv(tf, reference_strong=True)
    assert list(d.weak) == [1.0, 0.0] and list(d.strong) == [1.0, 1.0]


def test_cli_trains_on_judge_marks_of_the_weak_model(tmp_path, capsys):
    import csv

    from hybridllm.cli import main

    rng = np.random.default_rng(2)
    path = tmp_path / "judged.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["prompt", "mixtral_score"])
        for p, weak, _ in _labelled():  # long prompts get low marks
            w.writerow([p, int(rng.integers(4, 6)) if weak else int(rng.integers(1, 3))])
    out = tmp_path / "r"
    args = [
        "router",
        "train",
        "--data",
        str(path),
        "--out",
        str(out),
        "--no-embedding",
        "--score-range",
        "1,5",
    ]
    assert main(args) == 1
    assert "--reference-strong" in capsys.readouterr().err
    assert main([*args, "--reference-strong"]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert trained["cv"]["apgr"] > 0.55  # random: 0.5; a gain of the wrong sign reads below it
    columns = {"prompt": "prompt", "weak": "mixtral_score", "strong": "(reference)"}
    assert trained["columns"] == {"judged.csv": columns}
    info = json.loads((out / "router.json").read_text())["training"]
    assert "--reference-strong" in info["command"] and "--score-range 1,5" in info["command"]
    ev_args = ["router", "eval", "--data", str(path), "--router", str(out), "--json", "--score-range", "1,5"]
    assert main([*ev_args, "--reference-strong"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["strong_accuracy"] == 1.0 and ev["apgr"] > ev["baselines"]["random"]["apgr"]


def test_a_named_column_that_no_file_has_is_an_error(tmp_path):
    from hybridllm.router.train import train_from_csv

    a = _write(tmp_path / "a.csv", CSV)
    b = _jsonl(tmp_path / "b.jsonl", RECORDS)
    for option in ("prompt_col", "weak_col", "strong_col"):
        want = "No --data file has the column 'Prompt'.*a.csv: prompt, small, big"
        with pytest.raises(DataError, match=want):
            train_from_csv([a, b], tmp_path / "out", use_embedding=False, **{option: "Prompt"})
