"""`hybridllm chat` review 20: with stdout redirected or piped, nothing but the answers goes there,
neither /help's list nor the newline after a Ctrl-C that stopped an answer before it began."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from hybridllm import Chunk, Completion, cli


class Stream:
    def __init__(self, text, interrupt=False):
        self.text, self.interrupt, self.completion = text, interrupt, None

    def __iter__(self):
        if self.interrupt:  # Ctrl-C before the first word
            raise KeyboardInterrupt
        yield Chunk(text=self.text, route="edge", model="fake")
        self.completion = Completion(text=self.text, route="edge", reason="r", model="fake")


class Client:
    """Stands in for HybridLLM: device only; ``answers`` is what each question gets, in turn."""

    sent: list = []
    answers: list = []

    def __init__(self, **kw):
        self.cloud = None
        self.config = SimpleNamespace(max_tokens=256)
        self.edge = SimpleNamespace(model="fake", context_length=None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def stream(self, messages, **params):
        Client.sent.append([m["content"] for m in messages])
        return Client.answers.pop(0) if Client.answers else Stream("answer")


class Terminal(io.StringIO):
    """stdin on a terminal: the real input() reads it with readline() (it is no real descriptor)."""

    def isatty(self):
        return True


class Piped(io.StringIO):
    def isatty(self):
        return False


@pytest.fixture
def client(monkeypatch, tmp_path):
    Client.sent, Client.answers = [], []
    (tmp_path / "none.toml").write_text("")
    monkeypatch.setenv("HYBRIDLLM_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr("hybridllm._client.HybridLLM", Client)
    return Client


def test_help_stays_out_of_a_redirected_stdout(client, monkeypatch, capsys):
    """Before: `hybridllm chat > answers.txt` on a terminal wrote /help's command list into the
    file, between the answers (only a piped stdin kept it out), though the prompt went to stderr."""
    monkeypatch.setattr("sys.stdin", Terminal("/help\nhi\n/?\n"))
    assert cli.main(["chat"]) == 0
    out, err = capsys.readouterr()
    assert out == "answer\n"
    assert err.count("/reset clears the conversation") == 3  # the banner, /help and /?


def test_ctrl_c_before_the_answer_writes_no_blank_line_into_a_redirected_stdout(
        client, monkeypatch, capsys):
    """Before: Ctrl-C before the first word of an answer wrote an empty line into the redirected
    stdout (`hybridllm chat > answers.txt`), an answer that never was; now the line break goes
    where the prompt does, and the chat goes on."""
    client.answers = [Stream("", interrupt=True)]
    monkeypatch.setattr("sys.stdin", Terminal("stop\nhi\n"))
    assert cli.main(["chat"]) == 0
    out, err = capsys.readouterr()
    assert out == "answer\n"
    assert "the question is not kept" in err
    assert client.sent == [["stop"], ["hi"]]


def test_ctrl_c_in_a_piped_chat_adds_no_blank_answer(client, monkeypatch, capsys):
    """Before: `printf 'q1\\nq2\\n' | hybridllm chat > out` stopped by Ctrl-C before q2's answer
    began left out as "answer\\n\\n", a blank line no answer wrote (`ask` already wrote none)."""
    client.answers = [Stream("answer"), Stream("", interrupt=True)]
    monkeypatch.setattr("sys.stdin", Piped("q1\nq2\nq3\n"))
    assert cli.main(["chat"]) == 130
    out, err = capsys.readouterr()
    assert out == "answer\n"
    assert err.endswith("interrupted\n")
    assert client.sent == [["q1"], ["q1", "answer", "q2"]]  # it ended there: q3 was not sent


def test_ctrl_c_mid_answer_still_ends_the_answers_line(client, monkeypatch, capsys):
    """The rule the fix keeps: a partial answer on stdout is ended by a newline, so the next
    answer does not start on its line."""

    class Partial(Stream):
        def __iter__(self):
            yield Chunk(text="Once upon", route="edge", model="fake")
            raise KeyboardInterrupt

    client.answers = [Partial("")]
    monkeypatch.setattr("sys.stdin", Terminal("story\nhi\n"))
    assert cli.main(["chat"]) == 0
    out, err = capsys.readouterr()
    assert out == "Once upon\nanswer\n"
    assert client.sent[-1] == ["story", "Once upon", "hi"]
