"""Labelling a model pair: grading rules, the CSV it writes, and a fake cloud over HTTP."""

from __future__ import annotations

import io
import json

import httpx
import pytest

from hybridllm._exceptions import CloudError, DataError
from hybridllm.router import label as label_mod
from hybridllm.router._label_backends import _greedy_mean_logprob
from hybridllm.router.calibrate import calibrate_logprob_threshold
from hybridllm.router.dataset import load_routellm_csv
from hybridllm.router.label import (
    Question,
    is_correct,
    label_questions,
    read_questions,
    reference_answer,
    write_labels,
)


@pytest.mark.parametrize(
    ("answer", "reference", "ok"),
    [
        ("She has 3 + 4 = 7 apples. The answer is 7.", "7", True),
        ("The total is 1,250 dollars", "1250", True),
        ("First 12, then 18", "12", False),  # the last number counts
        ("no idea", "42", False),
        ("Paris", "paris", True),
        ("The answer is Paris", "Paris", True),
        ("B. insulin", "B", True),
        ("Berlin", "Paris", False),
        ("It was painted by Leonardo da Vinci. The answer is Leonardo da Vinci.", "Leonardo", True),
        ("Leonardo is a name. The answer is Michelangelo.", "Leonardo", False),  # the final answer counts
        ("The answer is C. 12", "B", False),
    ],
)
def test_grading(answer, reference, ok):
    assert is_correct(answer, reference) is ok


def test_gsm8k_reference():
    assert reference_answer("She pays 5 * 2 = 10.\n#### 10") == "10"


def test_read_questions_errors(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text('{"question": "x"}\n')
    with pytest.raises(DataError, match="needs 'question'"):
        read_questions(p)
    p.write_text("")
    with pytest.raises(DataError, match="no questions"):
        read_questions(p)


def test_label_and_train_ready_csv(tmp_path):
    qs = [Question(f"What is {i} + {i}?", str(2 * i)) for i in range(6)]

    def edge(prompt):  # right on even i, with high confidence when right
        i = int(prompt.split()[2])
        return (f"The answer is {2 * i if i % 2 == 0 else 0}", -0.2 if i % 2 == 0 else -2.0)

    def cloud(prompt):
        return f"The answer is {2 * int(prompt.split()[2])}", None

    rows = label_questions(qs, edge, cloud)
    out = write_labels(rows, tmp_path / "l.csv", edge_col="edge:smol", cloud_col="cloud:big")
    data = load_routellm_csv(out, weak_col="edge:smol", strong_col="cloud:big")
    assert list(data.weak) == [1, 0, 1, 0, 1, 0] and list(data.strong) == [1] * 6
    assert data.edge_logprob is not None
    t = calibrate_logprob_threshold(data.edge_logprob, data.weak)
    assert -2.0 < t <= -0.2  # wrong answers (-2.0) escalate, right ones (-0.2) do not


def test_openai_cloud_against_a_fake_server(monkeypatch):
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["url"] = str(request.url)
        seen["auth"] = request.headers.get("authorization")
        body = json.loads(request.content)
        assert body["temperature"] == 0.0
        return httpx.Response(
            200,
            json={
                "choices": [{"message": {"content": "The answer is 4"}, "finish_reason": "stop"}],
                "usage": {"completion_tokens": 5},
            },
        )

    real_client = httpx.Client
    monkeypatch.setattr(
        httpx, "Client", lambda **kw: real_client(transport=httpx.MockTransport(handler), **kw)
    )
    gen = label_mod.openai_cloud("http://cloud:8000", api_key="k")
    assert gen("2 + 2?").text == "The answer is 4"
    assert seen["url"] == "http://cloud:8000/v1/chat/completions" and seen["auth"] == "Bearer k"


def _sum_questions(n):
    return [Question(f"What is {i} + {i}?", str(2 * i)) for i in range(n)]


def _edge(prompt):  # right on even i
    i = int(prompt.split()[2])
    return f"The answer is {2 * i if i % 2 == 0 else 0}", -0.2 if i % 2 == 0 else -2.0


def test_label_to_csv_sends_the_cloud_concurrently_and_resumes(tmp_path):
    """The cloud side really runs ``concurrency`` calls at once; rows are appended as they
    finish; a second run skips the prompts already in the file and adds only the rest."""
    import threading
    import time

    lock, state = threading.Lock(), {"now": 0, "peak": 0, "calls": 0}

    def cloud(prompt):
        with lock:
            state["now"] += 1
            state["calls"] += 1
            state["peak"] = max(state["peak"], state["now"])
        time.sleep(0.02)
        with lock:
            state["now"] -= 1
        i = int(prompt.split()[2])
        return label_mod.Answer(f"The answer is {2 * i}", num_tokens=7, finish_reason="stop")

    out, answers = tmp_path / "l.csv", tmp_path / "a.jsonl"
    progress = io.StringIO()
    run = label_mod.label_to_csv(
        _sum_questions(4),
        _edge,
        cloud,
        out,
        edge_col="edge:s",
        cloud_col="cloud:b",
        concurrency=4,
        answers_out=answers,
        progress=progress,
    )
    assert (run.num_rows, run.num_added, run.num_skipped) == (4, 4, 0)
    assert state["peak"] >= 2  # concurrent, not one by one
    assert "ETA" in progress.getvalue() and "4/4" in progress.getvalue()
    run = label_mod.label_to_csv(
        _sum_questions(10), _edge, cloud, out, edge_col="edge:s", cloud_col="cloud:b", concurrency=4
    )
    assert (run.num_rows, run.num_added, run.num_skipped) == (10, 6, 4)
    assert state["calls"] == 10  # the first four were not asked again
    data = load_routellm_csv(out, weak_col="edge:s", strong_col="cloud:b")
    assert sorted(data.prompts) == sorted(q.prompt for q in _sum_questions(10))
    by_prompt = dict(zip(data.prompts, data.weak, strict=True))
    assert [by_prompt[q.prompt] for q in _sum_questions(10)] == [1, 0] * 5
    assert data.strong.tolist() == [1.0] * 10
    assert [json.loads(x)["cloud_tokens"] for x in answers.read_text().splitlines()] == [7] * 4
    with pytest.raises(DataError, match="other models"):  # never mixes two pairs in one file
        label_mod.label_to_csv(_sum_questions(2), _edge, cloud, out, edge_col="edge:x", cloud_col="cloud:b")


def test_label_to_csv_leaves_out_failed_questions_for_a_rerun(tmp_path):
    calls = []

    def cloud(prompt):
        calls.append(prompt)
        if "3 + 3" in prompt:
            raise CloudError("overloaded", status_code=503)
        return "The answer is 0", None

    out = tmp_path / "l.csv"
    run = label_mod.label_to_csv(
        _sum_questions(5), _edge, cloud, out, edge_col="e", cloud_col="c", concurrency=2, retries=1
    )
    assert (run.num_rows, run.num_failed) == (4, 1) and "overloaded" in run.errors[0]
    assert calls.count("What is 3 + 3?") == 2  # retried once
    assert "What is 3 + 3?" not in out.read_text()

    def down(prompt):
        raise CloudError("connection refused")

    with pytest.raises(CloudError, match="refused"):  # nothing works at all: say why
        label_mod.label_to_csv(
            _sum_questions(30), _edge, down, tmp_path / "m.csv", edge_col="e", cloud_col="c", retries=0
        )


def test_label_to_csv_stops_at_ctrl_c_and_keeps_the_rows(tmp_path):
    """Ctrl-C drops the queued questions at once (no wait for hundreds of queued answers), keeps
    every row already written, says how to resume, and a rerun picks up where it stopped."""
    import time

    edge_calls = []

    def edge(prompt):
        edge_calls.append(prompt)
        if len(edge_calls) == 4:
            raise KeyboardInterrupt
        time.sleep(0.01)
        return _edge(prompt)

    def cloud(prompt):
        time.sleep(0.01)
        return "The answer is 0", None

    out, progress = tmp_path / "l.csv", io.StringIO()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        label_mod.label_to_csv(
            _sum_questions(300), edge, cloud, out, edge_col="e", cloud_col="c", concurrency=2,
            progress=progress,
        )
    assert time.monotonic() - started < 2.0  # 300 queued edge answers would take 3 s
    assert len(edge_calls) <= 5
    assert "rerun the same command to resume" in progress.getvalue()
    dropped = int(progress.getvalue().split("stopping: ")[1].split()[0])
    assert 290 <= dropped <= 300  # questions, not answers (two per question)
    kept = load_routellm_csv(out, weak_col="e", strong_col="c")
    assert 1 <= len(kept.prompts) <= 4  # a question answered in flight (the 5th) gets its row too
    run = label_mod.label_to_csv(
        _sum_questions(300)[:10], _edge, cloud, out, edge_col="e", cloud_col="c", concurrency=2
    )
    assert run.num_skipped == len(kept.prompts) and run.num_rows == 10


def test_openai_cloud_errors(monkeypatch):
    real_client = httpx.Client
    monkeypatch.setattr(
        httpx,
        "Client",
        lambda **kw: real_client(
            transport=httpx.MockTransport(lambda r: httpx.Response(500, text="boom")), **kw
        ),
    )
    with pytest.raises(CloudError, match="500"):
        label_mod.openai_cloud("http://cloud/v1")("q")


@pytest.mark.real
def test_real_edge_model_answers_with_a_confidence(smollm2_path):
    """The real edge's label is the grade of its own answer, and its confidence is the mean
    log-probability of that answer (a sure answer scores higher than a forced-hot one)."""
    edge = label_mod.llama_cpp_edge(smollm2_path, max_tokens=12)
    answer = edge("What is 2 + 3?")
    text, lp = answer.text, answer.mean_logprob
    rows = label_questions(
        [Question("What is 2 + 3?", "5"), Question("What is 2 + 3?", "6")],
        lambda p: (text, lp),
        lambda p: ("The answer is 5", None),
    )
    assert [r["cloud"] for r in rows] == [True, False]  # graded, not copied
    assert [r["edge"] for r in rows] == [is_correct(text, "5"), is_correct(text, "6")]
    assert not (rows[0]["edge"] and rows[1]["edge"])  # one answer cannot be both 5 and 6
    assert lp is not None and -5.0 < lp < 0.0
    assert float(rows[0]["edge_mean_logprob"]) == pytest.approx(lp, abs=1e-4)


def test_greedy_mean_logprob_reads_the_completion_rows():
    """Row j of llama.cpp's saved logits predicts token j + 1: a 3-token prompt and a 2-token
    greedy completion are scored by rows 2 and 3 only, each as max - logsumexp."""
    import numpy as np

    scores = np.full((6, 4), -50.0)
    scores[2] = [0.0, 0.0, 0.0, 0.0]  # uniform: log(1/4)
    scores[3] = [10.0, -40.0, -40.0, -40.0]  # sure: ~0
    scores[[0, 1, 4, 5]] = [0.0, 0.0, 0.0, 0.0]  # not the completion: must not count
    got = _greedy_mean_logprob(scores, 3, 2)
    assert got == pytest.approx((np.log(0.25) + 0.0) / 2, abs=1e-6)
    assert _greedy_mean_logprob(scores, 3, 0) is None


@pytest.mark.parametrize(
    "tail",
    [
        "What is 5 + 5?,Tr",  # killed mid-row: appended to, it ran into the next row
        '"What is 5 + 5?\nand, more',  # a quoted prompt never closed swallowed every later row
        # all its cells, only its line end missing: its last cell may be cut short (3 of 37), so
        # a question of this run is labelled again (one that is not is kept: test_label_review20)
        "What is 5 + 5?,True,False,-0.20000,3",
    ],
)
def test_label_to_csv_resumes_past_a_half_written_last_row(tmp_path, tail):
    def cloud(prompt):
        return "The answer is 0", None

    out = tmp_path / "l.csv"
    label_mod.label_to_csv(_sum_questions(5), _edge, cloud, out, edge_col="e", cloud_col="c")
    with out.open("a", newline="", encoding="utf-8") as fh:
        fh.write(tail)
    run = label_mod.label_to_csv(_sum_questions(8), _edge, cloud, out, edge_col="e", cloud_col="c")
    assert (run.num_skipped, run.num_added, run.num_rows) == (5, 3, 8)
    data = load_routellm_csv(out, weak_col="e", strong_col="c")
    assert sorted(data.prompts) == sorted(q.prompt for q in _sum_questions(8))
    assert len(data.prompts) == 8


def test_label_to_csv_stops_when_the_cloud_goes_down_mid_run(tmp_path):
    """A cloud that dies after some rows stops the run with its error (rows kept, a rerun
    resumes), instead of asking it, and the edge, every remaining question for nothing; a run in
    which every question failed raises too, even when the file holds rows from an earlier run."""
    import time

    cloud_calls = []
    out = tmp_path / "l.csv"

    def cloud(prompt):  # down once the file holds 5 rows
        cloud_calls.append(prompt)
        time.sleep(0.002)
        if out.read_text(encoding="utf-8").count("\n") > 5:
            raise CloudError("Cannot reach http://cloud/v1/chat/completions")
        return "The answer is 0", None

    with pytest.raises(CloudError, match="Cannot reach"):
        label_mod.label_to_csv(
            _sum_questions(300), _edge, cloud, out, edge_col="e", cloud_col="c", concurrency=1
        )
    kept = load_routellm_csv(out, weak_col="e", strong_col="c")
    assert 5 <= len(kept.prompts) <= 10
    # then 20 questions of 3 tries each, not the other 290 (the edge answering each of them); the
    # cloud's thread may be a few questions ahead of the one that counts the failures (under load:
    # 4 calls ahead seen), so a margin of 5 questions, far below the 870 calls of not stopping
    assert len(cloud_calls) <= len(kept.prompts) + 3 * 20 + 3 * 5
    with pytest.raises(CloudError, match="Cannot reach"):  # 3 questions, all failed: not a success
        label_mod.label_to_csv(_sum_questions(300)[-3:], _edge, cloud, out, edge_col="e", cloud_col="c")


def test_read_questions_odd_files(tmp_path):
    """A byte-order mark and CRLF line ends read as any JSON Lines file does; a file that is not
    UTF-8, or a blank reference (every answer would be graded wrong), is a clear DataError."""
    p = tmp_path / "q.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"question": "2 + 2?", "answer": "4"}\r\n{"prompt": "Capital of Peru?", '
                  b'"reference": "Lima"}\r\n')
    assert read_questions(p) == [Question("2 + 2?", "4"), Question("Capital of Peru?", "Lima")]
    p.write_bytes(b'{"question": "caf\xe9?", "answer": "x"}\n')
    with pytest.raises(DataError, match="not UTF-8"):
        read_questions(p)
    p.write_text('{"question": "2 + 2?", "answer": "4"}\n{"question": "3 + 3?", "answer": " "}\n')
    with pytest.raises(DataError, match="line 2 needs"):
        read_questions(p)


def test_label_to_csv_answers_file_and_out_folder(tmp_path):
    """A half-written last line of --answers (a killed run) is cut off instead of running into
    the next answer; an --out that is a folder is a DataError, not an IsADirectoryError."""
    def cloud(prompt):
        return "The answer is 0", None

    out, answers = tmp_path / "l.csv", tmp_path / "sub" / "a.jsonl"
    label_mod.label_to_csv(_sum_questions(2), _edge, cloud, out, edge_col="e", cloud_col="c",
                           answers_out=answers)
    with answers.open("a", encoding="utf-8") as fh:
        fh.write('{"prompt": "What is 2 + 2?", "refer')
    label_mod.label_to_csv(_sum_questions(4), _edge, cloud, out, edge_col="e", cloud_col="c",
                           answers_out=answers)
    lines = [json.loads(line) for line in answers.read_text(encoding="utf-8").splitlines()]
    assert [a["prompt"] for a in lines] == [q.prompt for q in _sum_questions(4)]
    with pytest.raises(DataError, match="is a folder"):
        label_mod.label_to_csv(_sum_questions(2), _edge, cloud, tmp_path, edge_col="e", cloud_col="c")
