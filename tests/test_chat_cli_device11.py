"""`hybridllm chat` and `hybridllm ask` at their edges: a device backend that fails while the chat
measures the conversation, and what --help says about the defaults."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from hybridllm import cli


class BrokenEdge:
    """A device backend whose context length (or tokenizer) raises, as a closed one does."""

    name = "broken"
    model = "broken-edge"

    def __init__(self, error: Exception, *, in_tokenize: bool = False):
        self.error, self.in_tokenize = error, in_tokenize

    @property
    def context_length(self):
        if not self.in_tokenize:
            raise self.error
        return 64

    def tokenize(self, messages):
        raise self.error


class Stream:
    def __init__(self, text):
        self.text, self.completion = text, None

    def __iter__(self):
        from hybridllm import Chunk, Completion

        yield Chunk(text=self.text, route="edge", model="fake")
        self.completion = Completion(text=self.text, route="edge", reason="r", model="fake")


class Client:
    """Stands in for HybridLLM: device only, with the edge the test sets."""

    edge: object = None
    sent: list = []

    def __init__(self, **kw):
        self.cloud = None
        self.config = SimpleNamespace(max_tokens=256)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def stream(self, messages, **params):
        Client.sent.append([dict(m) for m in messages])
        return Stream("fine")


class Piped(io.StringIO):
    def isatty(self):
        return False


@pytest.fixture
def client(monkeypatch):
    Client.sent = []
    monkeypatch.setattr("hybridllm._client.HybridLLM", Client)
    return Client


@pytest.mark.parametrize("in_tokenize", [False, True])
def test_an_edge_that_fails_while_the_chat_measures_it_is_one_error_line_per_turn(
        client, monkeypatch, capsys, in_tokenize):
    """Before: the chat read edge.context_length (and called tokenize) outside its error handling,
    so a backend failing there ended the whole session on the first question with
    "internal error: RuntimeError: ... please report it" (exit 1), the next questions unread."""
    client.edge = BrokenEdge(RuntimeError("device went away"), in_tokenize=in_tokenize)
    monkeypatch.setattr("sys.stdin", Piped("first\nsecond\n"))
    assert cli.main(["chat"]) == 1  # piped: a failed turn shows in the exit status
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    # one line per failed question, and the session went on to the second: the tokenizer is only
    # asked once there is an older turn that could be dropped
    assert len(lines) == (1 if in_tokenize else 2), err
    assert len(client.sent) == (1 if in_tokenize else 0)
    assert "'broken' (BrokenEdge) failed: RuntimeError: device went away" in lines[0]


def test_a_closed_edge_says_it_is_closed_and_the_session_goes_on(client, monkeypatch, capsys):
    from hybridllm import EdgeError

    client.edge = BrokenEdge(EdgeError("The llama.cpp backend is closed; create a new one."))
    monkeypatch.setattr("sys.stdin", Piped("first\nsecond\n"))
    assert cli.main(["chat"]) == 1
    err = capsys.readouterr().err
    assert err.count("error: The llama.cpp backend is closed") == 2, err


def _options(command):
    import argparse

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.option_strings[0]: a.help for a in sub.choices[command]._actions
            if a.option_strings and a.option_strings[0] != "-h"}


@pytest.mark.parametrize("command", ["chat", "ask"])
def test_help_states_every_options_default(command):
    """Before: --max-tokens said "(256)" and --top-k "(40; 0 = off)" without saying that a setting
    (HYBRIDLLM_MAX_TOKENS, config.toml) comes first, and --seed, --stop, --system (and ask's
    --json) said nothing of what happens when they are left out."""
    options = _options(command)
    assert {"--max-tokens", "--seed", "--stop", "--system", "--backend", "--threads"} <= set(options)
    for name, text in options.items():
        assert "default" in text, f"{command} {name}: {text!r}"
    assert "the max_tokens setting, else 256" in options["--max-tokens"]
    assert "the temperature setting, else 0.7" in options["--temperature"]
    assert "the top_k setting, else 40" in options["--top-k"]
    assert "a new draw each time" in options["--seed"]
    assert "the edge_backend setting, else llama_cpp" in options["--backend"]



def test_chat_with_stdin_closed_is_a_usage_error_before_any_model_loads(monkeypatch, capsys):
    """Before: `hybridllm chat <&-` loaded the model, then ended on "internal error: RuntimeError:
    input(): lost sys.stdin ... please report it" (exit 1)."""
    built = []
    monkeypatch.setattr("hybridllm._client.HybridLLM", lambda **kw: built.append(kw))
    monkeypatch.setattr("sys.stdin", None)
    assert cli.main(["chat"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hybridllm chat: error: chat reads its questions from stdin, which is closed")
    assert built == []
