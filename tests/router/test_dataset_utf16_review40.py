"""Labelled and prompt files saved as UTF-16 with its byte-order mark (Windows PowerShell 5's ``>``
and Out-File, Excel's "Unicode Text") are read; they were refused as "not a readable UTF-8 CSV
file" (byte 0xff) with no word of what they are. A file in another 8-bit encoding is refused
with what to do."""

from __future__ import annotations

import json

import pytest

from hybridllm._exceptions import DataError
from hybridllm.router.dataset import file_columns, load_routellm_csv, read_prompts
from hybridllm.router.label import read_questions

ROWS = ["prompt,weak,strong", "Café crème?,False,True", "Wie viel ist 17 mal 23?,True,True", "hi,False,False"]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_a_utf16_csv_loads(tmp_path, encoding):
    p = tmp_path / "labels.csv"
    bom = "\ufeff" if encoding == "utf-16-be" else ""  # the utf-16 codec writes its own
    p.write_bytes((bom + "\r\n".join(ROWS) + "\r\n").encode(encoding))
    data = load_routellm_csv(p)
    assert data.prompts == ["Café crème?", "Wie viel ist 17 mal 23?", "hi"]
    assert data.weak_col == "weak" and list(data.strong) == [1.0, 1.0, 0.0]
    assert file_columns(p) == ["prompt", "weak", "strong"]


def test_a_utf16_tab_file_and_jsonl_load(tmp_path):
    tsv = tmp_path / "labels.tsv"
    tsv.write_text("\n".join(r.replace(",", "\t") for r in ROWS) + "\n", encoding="utf-16")
    assert load_routellm_csv(tsv).prompts[0] == "Café crème?"
    jsonl = tmp_path / "labels.jsonl"
    recs = [{"prompt": "Café?", "weak": False, "strong": True}, {"prompt": "b", "weak": True, "strong": True}]
    jsonl.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in recs) + "\n", encoding="utf-16")
    assert load_routellm_csv(jsonl).prompts == ["Café?", "b"]


def test_utf16_prompt_and_question_files_read(tmp_path):
    txt = tmp_path / "traffic.txt"
    txt.write_text("Café?\nhello\n", encoding="utf-16")
    assert read_prompts(txt) == ["Café?", "hello"]
    csv_file = tmp_path / "traffic.csv"
    csv_file.write_text("prompt\nCafé?\n", encoding="utf-16")
    assert read_prompts(csv_file) == ["Café?"]
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question": "2+2?", "answer": "4"}) + "\n", encoding="utf-16")
    assert [q.prompt for q in read_questions(questions)] == ["2+2?"]


def test_a_cp1252_csv_is_refused_with_what_to_do(tmp_path):
    p = tmp_path / "labels.csv"
    p.write_bytes("\r\n".join(ROWS).encode("cp1252"))
    with pytest.raises(DataError, match="save it as UTF-8"):
        load_routellm_csv(p)
