"""`hybridllm chat` review 20: `//` sends a line that starts with a slash, a Ctrl-C while a whole
answer's trace line prints returns to the prompt, and turns are never dropped unannounced."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from hybridllm import Chunk, CloudError, Completion, _chat_cli, cli


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
    """Stands in for HybridLLM. With a cloud, a conversation past the device's context fails as a
    cloud that could not take it does (a CloudError with the prompt's numbers), unless the chat
    forces the device; without one every prompt is answered."""

    sent: list = []
    cloud = None

    def __init__(self, **kw):
        self.edge = Edge()
        self.config = SimpleNamespace(max_tokens=8)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def stream(self, messages, **params):
        n = len(self.edge.tokenize(messages))
        if self.cloud is not None and params.get("route") != "edge" and n + 8 > 40:
            raise CloudError("the cloud is down", prompt_tokens=n, context_length=40)
        Client.sent.append([m["content"] for m in messages])
        return Stream("ok")


class Terminal(io.StringIO):
    def isatty(self):
        return True


class Piped(io.StringIO):
    def isatty(self):
        return False


@pytest.fixture
def client(monkeypatch, tmp_path):
    Client.sent, Client.cloud = [], None
    (tmp_path / "none.toml").write_text("")
    monkeypatch.setenv("HYBRIDLLM_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setattr("hybridllm._client.HybridLLM", Client)
    return Client


def test_a_double_slash_sends_a_line_that_starts_with_a_slash(client, monkeypatch, capsys):
    """Before: `/tmp is what?` was refused as an unknown command and nothing could send it:
    `//tmp is what?` went as it was, both slashes. Now `//` sends the line with one slash less,
    and the refusal says so. A first word that is a path (a further slash) is sent as it is."""
    monkeypatch.setattr("sys.stdin", Piped("/tmp is what?\n//tmp is what?\n/usr/bin/env explained\n"
                                           "//exit\n/exit\n"))
    assert cli.main(["chat"]) == 1  # the refused line still makes a piped chat exit 1
    out, err = capsys.readouterr()
    assert "unknown command /tmp, not sent" in err and "//tmp ..." in err
    assert [sent[-1] for sent in client.sent] == ["/tmp is what?", "/usr/bin/env explained", "/exit"]
    assert "//" in _chat_cli.CHAT_HELP


def test_ctrl_c_while_the_trace_line_prints_returns_to_the_prompt(client, monkeypatch, capsys):
    """Before: a Ctrl-C just after an answer finished, while its route/latency line was printed,
    ended the whole chat (130). Now it returns to the prompt, the whole answer kept."""
    real = _chat_cli.trace_line
    calls = []

    def trace_line(done):
        calls.append(done)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(done)

    monkeypatch.setattr(_chat_cli, "trace_line", trace_line)
    monkeypatch.setattr("sys.stdin", Terminal("first\nsecond\n"))
    assert cli.main(["chat"]) == 0
    out, err = capsys.readouterr()
    assert out == "ok\nok\n"
    assert "stopped" not in err  # the answer was whole: no "partial answer" note
    assert client.sent == [["first"], ["first", "ok", "second"]]


def test_ctrl_c_while_the_trace_line_prints_still_ends_a_piped_chat(client, monkeypatch, capsys):
    """The rule kept: a piped chat ends on Ctrl-C (130) rather than going on to the next question."""
    def trace_line(done):
        raise KeyboardInterrupt

    monkeypatch.setattr(_chat_cli, "trace_line", trace_line)
    monkeypatch.setattr("sys.stdin", Piped("first\nsecond\n"))
    assert cli.main(["chat"]) == 130
    assert client.sent == [["first"]]


@pytest.mark.parametrize("cloud", [None, "cloud"])
def test_turns_are_never_dropped_unannounced(client, monkeypatch, capsys, cloud):
    """Before: the chat dropped the oldest turns, then printed its note; a Ctrl-C before the note
    printed (with no cloud, or in the cloud-failed fallback) left them gone with nothing said. Now
    they go only once the note has printed: interrupted, they are kept."""
    client.cloud = cloud
    real = _chat_cli._note
    interrupted = []

    def note(text):
        if "dropped" in text and not interrupted:
            interrupted.append(text)
            raise KeyboardInterrupt  # Ctrl-C before the note reached the terminal
        real(text)

    monkeypatch.setattr(_chat_cli, "_note", note)
    q1, q2, q3 = ("one " * 10, "two " * 10, "three " * 10)
    monkeypatch.setattr("sys.stdin", Terminal(f"{q1}\n{q2}\n{q3}\nhi\n"))
    assert cli.main(["chat", "--max-tokens", "8"]) == 0
    out, err = capsys.readouterr()
    assert interrupted and "stopped before the answer began" in err
    # the turns the interrupted note spoke of are still there when "hi" comes, and when they go
    # the note says so
    assert "dropped its 2 oldest messages" in err
    assert client.sent[-1] == [q2.strip(), "ok", "hi"]


def test_ctrl_c_as_a_whole_answer_is_taken_keeps_it(client, monkeypatch, capsys):
    """Before: a Ctrl-C in the instant between the answer's last word and its joining the
    conversation ended the chat (130). Now the whole answer is kept and the chat goes on."""

    class Late(Stream):
        asked = 0

        @property
        def completion(self):
            Late.asked += 1
            if Late.asked == 1:
                raise KeyboardInterrupt
            return self._done

        @completion.setter
        def completion(self, value):
            self._done = value

    answers = [Late("whole")]
    real = Client.stream

    def stream(self, messages, **params):
        if answers:
            Client.sent.append([m["content"] for m in messages])
            return answers.pop()
        return real(self, messages, **params)

    monkeypatch.setattr(Client, "stream", stream)
    monkeypatch.setattr("sys.stdin", Terminal("first\nsecond\n"))
    assert cli.main(["chat"]) == 0
    out, err = capsys.readouterr()
    assert out == "whole\nok\n" and "stopped" not in err
    assert client.sent == [["first"], ["first", "whole", "second"]]
