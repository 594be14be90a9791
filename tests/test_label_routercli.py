"""`hybridllm router label` as a user labelling their own pair: answers graded by the final answer
they state, and a cloud that cannot be reached stops the run at once, not after the edge side."""

from __future__ import annotations

import contextlib
import json
import socket
import time

import httpx
import pytest

from hybridllm._exceptions import CloudError, DataError
from hybridllm.router import _label_backends
from hybridllm.router import label as label_mod
from hybridllm.router.label import Question, is_correct


@pytest.mark.parametrize(
    ("answer", "reference", "ok"),
    [
        # multiple choice: the letter after the cue, in the formats models write
        ("The answer is (C) 12.", "C", True),
        ("The answer is B) Paris", "B", True),
        ("Answer: B", "B", True),
        ("**Answer:** (D)", "D", True),
        ("The correct option is D.", "D", True),
        ("B Paris", "B", True),
        # the article "A" opening a worked answer is not the option A
        ("A good start: 3 + 4 = 7. The answer is C.", "A", False),
        ("A farmer has 3 cows, so 3 legs more.", "A", False),
        # yes/no: the final answer counts, not the reply's first word
        ("The answer is no, because 3 < 4.", "no", True),
        ("No. Looking again, the answer is yes.", "no", False),
        # numbers: the one stated as the answer, not a later aside
        ("The answer is 18 (from step 2).", "18", True),
        ("So 7 apples. The answer is 7 apples, 3 left over.", "7", True),
        ("The answer is 3 * 4 = 12.", "12", True),
        ("The answer is \u22123.", "-3", True),
        ("The answer is $1,000.", "$1,000", True),
        # "option is" states a letter, not a number: a worked answer's step stays a step
        ("One option is 3 boxes of 2, so 6 in all.", "6", True),
        # a fraction is not the number its last digits make
        ("The answer is 4.", "3/4", False),
        ("The answer is 3/4.", "3/4", True),
    ],
)
def test_graded_by_the_stated_final_answer(answer, reference, ok):
    assert is_correct(answer, reference) is ok


def _questions(n):
    return [Question(f"What is {i} + {i}?", str(2 * i)) for i in range(n)]


def test_a_cloud_never_reached_stops_the_run_before_the_edge_side(tmp_path):
    """A wrong --cloud whose every try takes a while to fail (a connect timeout) stopped only after
    20 questions of 3 tries each, while the edge answered question after question for nothing."""
    edge_calls, cloud_calls = [], []

    def edge(prompt):
        edge_calls.append(prompt)
        time.sleep(0.005)
        return "The answer is 0", -1.0

    def cloud(prompt):
        cloud_calls.append(prompt)
        time.sleep(0.05)
        raise CloudError("Cannot reach http://10.0.0.9:8000/v1/chat/completions: timed out; check --cloud.")

    out = tmp_path / "l.csv"
    with pytest.raises(CloudError, match="no cloud answer came back yet.*--cloud"):
        label_mod.label_to_csv(_questions(300), edge, cloud, out, edge_col="e", cloud_col="c", concurrency=2)
    # the first two questions' 3 tries, then one try of each of the next two already in flight
    assert len(cloud_calls) <= 2 * 3 + 2
    assert len(edge_calls) <= 40  # without the stop: over 100
    assert out.read_text(encoding="utf-8").count("\n") == 1  # the header, no half-labelled rows


def test_a_refused_key_or_model_is_not_retried_and_stops_at_once(tmp_path):
    """401/403/404 (wrong key, path or model name) stop the run at its first answer, even after
    rows were written; a 503 (overloaded) only leaves that question for a rerun."""
    calls = []

    def cloud(prompt):
        calls.append(prompt)
        time.sleep(0.01)
        if len(calls) > 3:
            raise CloudError("http://cloud/v1/chat/completions answered 401: bad key", status_code=401)
        return "The answer is 0", None

    def edge(prompt):
        return "The answer is 0", -1.0

    out = tmp_path / "l.csv"
    with pytest.raises(CloudError, match="401.*every question would get this.*--api-key"):
        label_mod.label_to_csv(_questions(100), edge, cloud, out, edge_col="e", cloud_col="c", concurrency=1)
    # three rows, then a 401, not retried; the next question is not sent (on a loaded machine the
    # pool's worker sent one or two more before the main thread saw the 401)
    assert len(calls) == 4
    assert out.read_text(encoding="utf-8").count("\n") == 4


@contextlib.contextmanager
def _firewalled_port():
    """A port whose connections hang (SYNs dropped, as a firewall does): a listening socket whose
    accept queue is full."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    queued = []
    try:
        for _ in range(3):
            c = socket.socket()
            c.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                c.connect(("127.0.0.1", port))
            queued.append(c)
        time.sleep(0.1)
        yield port
    finally:
        for c in queued:
            c.close()
        server.close()


def test_openai_cloud_gives_up_connecting_long_before_the_answer_timeout(monkeypatch):
    """A firewalled --cloud failed each try only after the whole --timeout, meant for a long answer
    (15 min by default)."""
    monkeypatch.setattr(_label_backends, "CONNECT_TIMEOUT_S", 0.5, raising=False)
    with _firewalled_port() as port:
        generate = label_mod.openai_cloud(f"http://127.0.0.1:{port}", timeout=30.0)
        started = time.monotonic()
        with pytest.raises(CloudError, match="Cannot reach") as err:
            generate("What is 1 + 1?")
        assert time.monotonic() - started < 5.0
        assert err.value.status_code is None


@pytest.mark.real
def test_real_edge_with_a_firewalled_cloud_stops_early_through_the_cli(
    smollm2_path, tmp_path, capsys, monkeypatch
):
    """`hybridllm router label` with the real SmolLM2 edge and a --cloud that never connects: a
    clear error and exit 1 after the first questions' tries, no rows. Before, each try waited the
    whole --timeout and the run stopped only after 20 questions, the edge answering all along."""
    from hybridllm.cli import main

    monkeypatch.setattr(_label_backends, "CONNECT_TIMEOUT_S", 0.3, raising=False)
    real_edge, edge_calls = label_mod.llama_cpp_edge, []

    def counted_edge(*args, **kwargs):
        generate = real_edge(*args, **kwargs)

        def counted(prompt):
            edge_calls.append(prompt)
            return generate(prompt)

        return counted

    monkeypatch.setattr(label_mod, "llama_cpp_edge", counted_edge)
    data = tmp_path / "q.jsonl"
    data.write_text(
        "".join(json.dumps({"question": q.prompt, "answer": q.reference}) + "\n" for q in _questions(40))
    )
    out = tmp_path / "labels.csv"
    with _firewalled_port() as port:
        started = time.monotonic()
        rc = main(["router", "label", "--data", str(data), "--edge", str(smollm2_path), "--cloud",
                   f"http://127.0.0.1:{port}", "--timeout", "2", "--out", str(out),
                   "--edge-max-tokens", "16", "--concurrency", "2"])
        took = time.monotonic() - started
    assert rc == 1
    err = capsys.readouterr().err
    assert "Cannot reach" in err and "no cloud answer came back yet" in err and "Traceback" not in err
    assert took < 30.0  # before: 20 questions x 3 tries x 2 s, two at a time (60 s); now ~5 s
    assert len(edge_calls) < 40
    assert out.read_text(encoding="utf-8").count("\n") == 1  # the header only


def _edge_right(prompt):
    return f"The answer is {2 * int(prompt.split()[2])}", -0.5


def test_resuming_with_other_settings_is_refused_not_mixed(tmp_path):
    """The columns name the models, not the cloud model behind `cloud:default` or the token limits
    that decide whether an answer was cut off: a rerun with a longer --max-tokens appended rows
    graded another way to the same file."""
    out = tmp_path / "l.csv"
    first = {"cloud_model": "default", "max_tokens": 64, "edge_max_tokens": 64}
    run = label_mod.label_to_csv(_questions(3), _edge_right, _edge_right, out, edge_col="e", cloud_col="c",
                                 settings=first)
    assert run.num_rows == 3 and label_mod.settings_path(out).is_file()
    with pytest.raises(DataError, match=r"other settings \(max_tokens 64 then, 256 now"):
        label_mod.label_to_csv(_questions(6), _edge_right, _edge_right, out, edge_col="e", cloud_col="c",
                               settings={**first, "max_tokens": 256})
    assert out.read_text(encoding="utf-8").count("\n") == 4  # nothing appended
    run = label_mod.label_to_csv(_questions(6), _edge_right, _edge_right, out, edge_col="e", cloud_col="c",
                                 settings=first)
    assert (run.num_skipped, run.num_added) == (3, 3)


def test_a_file_without_settings_resumes_and_an_empty_one_takes_the_new_ones(tmp_path):
    out = tmp_path / "l.csv"
    label_mod.label_to_csv(_questions(2), _edge_right, _edge_right, out, edge_col="e", cloud_col="c")
    assert not label_mod.settings_path(out).exists()  # made without settings: resumed unchecked
    run = label_mod.label_to_csv(_questions(3), _edge_right, _edge_right, out, edge_col="e", cloud_col="c",
                                 settings={"max_tokens": 8})
    assert run.num_added == 1
    header_only = tmp_path / "h.csv"
    header_only.write_text("prompt,e,c,edge_mean_logprob,cloud_tokens\n", encoding="utf-8")
    label_mod.settings_path(header_only).write_text('{"max_tokens": 8}', encoding="utf-8")
    run = label_mod.label_to_csv(_questions(2), _edge_right, _edge_right, header_only, edge_col="e",
                                 cloud_col="c", settings={"max_tokens": 16})  # no rows: nothing to mix
    assert run.num_added == 2
    assert json.loads(label_mod.settings_path(header_only).read_text()) == {"max_tokens": 16}


@pytest.mark.real
def test_real_edge_resume_with_another_edge_limit_is_refused_through_the_cli(
    smollm2_path, tmp_path, capsys, monkeypatch
):
    """Real SmolLM2 edge, a fake OpenAI-compatible cloud: a run resumed with another
    --edge-max-tokens is refused with what changed, and the same command resumes."""
    from hybridllm.cli import main

    def handler(request):
        return httpx.Response(200, json={
            "choices": [{"message": {"content": "The answer is 2"}, "finish_reason": "stop"}],
            "usage": {"completion_tokens": 4},
        })

    real_client = httpx.Client
    fake = httpx.MockTransport(handler)
    monkeypatch.setattr(httpx, "Client", lambda **kw: real_client(transport=fake, **kw))
    data = tmp_path / "q.jsonl"
    data.write_text(
        "".join(json.dumps({"question": q.prompt, "answer": q.reference}) + "\n" for q in _questions(2))
    )
    out = tmp_path / "labels.csv"
    base = ["router", "label", "--data", str(data), "--edge", str(smollm2_path), "--cloud",
            "http://cloud:8000", "--out", str(out)]
    assert main([*base, "--edge-max-tokens", "8", "--limit", "1"]) == 0
    capsys.readouterr()
    assert main([*base, "--edge-max-tokens", "12"]) == 1
    err = capsys.readouterr().err
    assert "edge_max_tokens 8 then, 12 now" in err and "Traceback" not in err
    assert main([*base, "--edge-max-tokens", "8"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["resumed_from"], result["added"], result["n"]) == (1, 1, 2)
