"""Bad input files give clear DataErrors; good ones load with the right columns."""

from __future__ import annotations

import json

import pytest

from hybridllm._exceptions import DataError
from hybridllm.router.calibrate import read_prompts
from hybridllm.router.dataset import load_routellm_csv


def write(tmp_path, text, name="d.csv"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_loads_and_orders_weak_strong(tmp_path):
    text = "prompt,big,small,domain\nq1,True,False,x\nq2,True,True,y\nq3,False,False,z\n"
    p = write(tmp_path, text)
    d = load_routellm_csv(p)
    assert (d.weak_col, d.strong_col) == ("small", "big")  # the less accurate one is weak
    assert list(d.labels) == [1, 0, 0]
    d2 = load_routellm_csv(p, weak_col="big", strong_col="small")
    assert d2.weak_col == "big"


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_routellm_csv(tmp_path / "nope.csv")


def test_empty_file(tmp_path):
    with pytest.raises(DataError, match="empty"):
        load_routellm_csv(write(tmp_path, ""))


def test_header_only(tmp_path):
    with pytest.raises(DataError, match="no rows"):
        load_routellm_csv(write(tmp_path, "prompt,a,b\n"))


def test_no_prompt_column(tmp_path):
    with pytest.raises(DataError, match="no 'prompt' column.*--prompt-col"):
        load_routellm_csv(write(tmp_path, "body,a,b\nq,True,False\n"))
    # two columns that could each be the prompt: the file has to say which
    with pytest.raises(DataError, match="--prompt-col"):
        load_routellm_csv(write(tmp_path, "question,input,a,b\nq,i,True,False\n", "two.csv"))


def test_wrong_model_columns(tmp_path):
    p = write(tmp_path, "prompt,a,b,c\nq,True,False,True\n")
    with pytest.raises(DataError, match="--weak-col and --strong-col"):
        load_routellm_csv(p)
    with pytest.raises(DataError, match="no column 'zz'"):
        load_routellm_csv(p, weak_col="zz")
    p2 = write(tmp_path, "prompt,a,b\nq,True,maybe\n", "e.csv")
    with pytest.raises(DataError, match="not all scores"):
        load_routellm_csv(p2, weak_col="a", strong_col="b")


def test_read_prompts_formats(tmp_path):
    assert read_prompts(write(tmp_path, '{"prompt": "a"}\n\n{"question": "b"}\n', "p.jsonl")) == [
        "a", "b"]
    msgs = '{"messages": [{"role": "user", "content": "hi"}]}\n'
    assert read_prompts(write(tmp_path, msgs, "m.jsonl")) == ["hi"]
    assert read_prompts(write(tmp_path, "one\ntwo\n", "p.txt")) == ["one", "two"]
    with pytest.raises(DataError, match="no prompts"):
        read_prompts(write(tmp_path, "\n", "e.txt"))
    with pytest.raises(DataError, match="line 1 is not valid JSON"):
        read_prompts(write(tmp_path, "{oops\n", "b.jsonl"))


def test_read_prompts_reads_what_the_labelled_files_hold(tmp_path):
    """Calibration prompts are read the way training files are: the same prompt columns, the
    same conversations, TSV and a byte-order mark."""
    mixed = '"bare string"\n{"query": "q"}\n{"turns": ["first", "second"]}\n'
    parts = {"messages": [{"role": "system", "content": "s"},
                          {"role": "user", "content": [{"type": "text", "text": "parts"}]}]}
    assert read_prompts(write(tmp_path, mixed + json.dumps(parts) + "\n", "m.jsonl")) == [
        "bare string", "q", "second", "parts"]
    assert read_prompts(write(tmp_path, '[{"body": "x"}, "y"]', "a.json"), "body") == ["x", "y"]
    with pytest.raises(DataError, match="record 1 has no 'prompt'.*--prompt-col"):
        read_prompts(write(tmp_path, '{"body": "x"}\n', "n.jsonl"))
    assert read_prompts(write(tmp_path, "id,question\n1,a\n2,\n3,c\n", "q.csv")) == ["a", "c"]
    assert read_prompts(write(tmp_path, "\ufeffprompt\tn\nhi\t1\n", "t.tsv")) == ["hi"]
    assert read_prompts(write(tmp_path, 'body\n"[""one"", ""two""]"\n', "b.csv"), "body") == ["two"]
    with pytest.raises(DataError, match="--prompt-col"):
        read_prompts(write(tmp_path, "body\nx\n", "c.csv"))
