"""`hybridllm chat` review 19: a blank --model refused, a question too long for the device model
that no longer costs the conversation, and /help kept out of a piped chat's answers."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from hybridllm import Chunk, Completion, ContextWindowExceededError, cli


class Piped(io.StringIO):
    def isatty(self):
        return False


class Edge:
    """A device model whose tokens are the words of the conversation, with a small context."""

    name = "words"
    model = "words-edge"
    context_length = 40

    def tokenize(self, messages):
        return [0 for m in messages for _ in m["content"].split()] + [0] * (2 * len(messages))


class Stream:
    def __init__(self, text):
        self.text, self.completion = text, None

    def __iter__(self):
        yield Chunk(text=self.text, route="edge", model="fake")
        self.completion = Completion(text=self.text, route="edge", reason="r", model="fake")


class Client:
    """Stands in for HybridLLM: device only, refusing a prompt past the context as a backend does."""

    sent: list = []

    def __init__(self, **kw):
        self.cloud, self.edge = None, Edge()
        self.config = SimpleNamespace(max_tokens=8)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def stream(self, messages, **params):
        n, limit = len(self.edge.tokenize(messages)), self.edge.context_length
        if n >= limit:
            raise ContextWindowExceededError(f"The prompt is {n} tokens; the context holds {limit}.",
                                             prompt_tokens=n, context_length=limit)
        Client.sent.append([dict(m) for m in messages])
        return Stream("ok")


@pytest.fixture
def client(monkeypatch):
    Client.sent = []
    monkeypatch.setattr("hybridllm._client.HybridLLM", Client)
    return Client


@pytest.mark.parametrize("command", [["chat"], ["ask", "hi"]])
@pytest.mark.parametrize("value", ["", " "])
def test_a_blank_model_is_a_usage_error_naming_the_option(monkeypatch, capsys, command, value):
    """Before: `--model ""` (an unset "$MODEL") read as left out: "Preparing smollm2-135m-instruct"
    was shown, then "error: Unknown model ''" (exit 1) once the settings were read."""
    def fail(**kw):
        raise AssertionError("loaded despite a blank --model")
    monkeypatch.setattr("hybridllm._client.HybridLLM", fail)
    monkeypatch.setattr("sys.stdin", Piped("hi\n"))
    with pytest.raises(SystemExit) as exit_:
        cli.main([*command, "--model", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hybridllm {command[0]}: error: argument --model: "), err
    assert repr(value) in err[0]


def test_a_question_past_the_context_keeps_the_conversation(client, monkeypatch, capsys):
    """Before: a question too long for the device model on its own (a long paste) first had every
    older turn dropped to make room, then failed anyway: the error was shown, and the conversation
    was gone too (the next question was sent without it). Now the conversation is kept whole."""
    long = " ".join(["word"] * 60)
    monkeypatch.setattr("sys.stdin", Piped(f"first question\nsecond one\n{long}\nthird\n"))
    assert cli.main(["chat", "--system", "be brief"]) == 1  # piped: the failed turn shows in the status
    captured = capsys.readouterr()
    assert captured.out.count("ok") == 3
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "The prompt is" in errors[0], captured.err
    assert "dropped" not in captured.err
    # the last question was sent with the whole conversation before the long one
    assert [m["content"] for m in client.sent[-1]] == [
        "be brief", "first question", "ok", "second one", "ok", "third"]


def test_old_turns_are_still_dropped_when_that_makes_room(client, monkeypatch, capsys):
    """The rule the fix keeps: a question that fits once older turns go still drops them."""
    middle = " ".join(["word"] * 20)
    monkeypatch.setattr("sys.stdin", Piped(f"first question\n{middle}\n{middle}\n"))
    assert cli.main(["chat"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("ok") == 3
    assert "dropped its" in captured.err
    assert [m["content"] for m in client.sent[-1]] == [middle]


def test_help_in_a_piped_chat_stays_off_stdout(client, monkeypatch, capsys):
    """Before: `/help` in a piped chat (or one with stdout redirected) printed the command list to
    stdout, into the answers that README says stdout holds alone."""
    monkeypatch.setattr("sys.stdin", Piped("/help\nhi\n"))
    assert cli.main(["chat"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "ok\n"
    assert "/reset clears the conversation" in captured.err
