"""Prompts held as ShareGPT turns (``{"from": "human", "value": ...}`` under ``conversations``, as
many chat datasets write them) train, evaluate and calibrate on their last human turn; they were
refused as "a list but not a conversation (messages[0] has role None)"."""

from __future__ import annotations

import csv
import json

import pytest

from hybridllm._exceptions import DataError
from hybridllm.router.dataset import load_routellm_csv, read_prompts


def _turns(question: str) -> list[dict[str, str]]:
    return [
        {"from": "system", "value": "Answer briefly."},
        {"from": "human", "value": "an earlier question"},
        {"from": "gpt", "value": "an earlier answer"},
        {"from": "human", "value": question},
    ]


def test_sharegpt_jsonl_trains_on_the_last_human_turn(tmp_path):
    p = tmp_path / "labels.jsonl"
    recs = [{"conversations": _turns(f"q{i}"), "weak": i % 2, "strong": 1} for i in range(3)]
    p.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    data = load_routellm_csv(p)
    assert data.prompts == ["q0", "q1", "q2"] and data.prompt_col == "conversations"
    assert read_prompts(p) == ["q0", "q1", "q2"]


def test_sharegpt_in_a_csv_cell_is_its_last_human_turn(tmp_path):
    p = tmp_path / "labels.csv"
    with p.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["conversations", "weak", "strong"])
        w.writerow([json.dumps(_turns("as JSON")), 0, 1])
        w.writerow([str(_turns("as Python prints it")), 1, 1])
    assert load_routellm_csv(p).prompts == ["as JSON", "as Python prints it"]


def test_a_sharegpt_turn_of_an_unknown_speaker_is_refused_with_its_record(tmp_path):
    p = tmp_path / "labels.jsonl"
    p.write_text(
        json.dumps({"conversations": [{"from": "narrator", "value": "x"}], "weak": 0, "strong": 1}) + "\n"
    )
    with pytest.raises(DataError, match="record 1"):
        load_routellm_csv(p)
