"""`hybridllm ask` reads at most MAX_STDIN_BYTES from stdin (review 28). Before, it read stdin
whole: `hybridllm ask < /dev/zero` filled memory until it was killed."""

from __future__ import annotations

import io

import pytest

from hybridllm import _chat_cli, cli
from tests.test_cli import ChatFake, FakeEdge


class Endless(io.RawIOBase):
    """/dev/zero that gives up after `cap` bytes (so the old, unbounded read fails, not hangs)."""

    def __init__(self, cap: int) -> None:
        self.cap, self.given = cap, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        if self.given >= self.cap:
            raise AssertionError(f"stdin read past {self.cap} bytes")
        n = min(len(b), self.cap - self.given)
        b[:n] = bytes(n)
        self.given += n
        return n


def piped(raw: io.RawIOBase | bytes, encoding: str = "utf-8") -> io.TextIOWrapper:
    """A stdin as Python makes it for a pipe: text over a buffered binary stream."""
    source = io.BytesIO(raw) if isinstance(raw, bytes) else raw
    return io.TextIOWrapper(io.BufferedReader(source), encoding=encoding)


@pytest.fixture
def fake(monkeypatch):
    ChatFake.sent, ChatFake.answers, ChatFake.edge = [], [], FakeEdge()
    monkeypatch.setattr("hybridllm._client.HybridLLM", ChatFake)
    return ChatFake


def test_endless_stdin_is_a_usage_error_naming_the_bound(fake, monkeypatch, capsys):
    source = Endless(8 * _chat_cli.MAX_STDIN_BYTES)
    monkeypatch.setattr("sys.stdin", piped(source))
    assert cli.main(["ask"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "over 4 MiB" in err and "head -c" in err
    assert source.given <= _chat_cli.MAX_STDIN_BYTES + 2**16  # read to the bound, not on
    assert fake.sent == []  # refused before the client was built


def test_a_prompt_one_byte_past_the_bound_is_refused_and_one_at_it_is_sent(fake, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", piped(b"x" * (_chat_cli.MAX_STDIN_BYTES + 1)))
    assert cli.main(["ask"]) == 2
    assert "over 4 MiB" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", piped(b"x" * _chat_cli.MAX_STDIN_BYTES))
    assert cli.main(["ask", "-"]) == 0
    assert len(fake.sent[-1]) == _chat_cli.MAX_STDIN_BYTES


def test_normal_piping_still_reads_the_whole_text(fake, monkeypatch, capsys):
    # no trailing newline, UTF-8, a Windows line end, a byte that is not UTF-8
    monkeypatch.setattr("sys.stdin", piped("café\r\nnaïve? \u4f60\u597d".encode() + b"\xff"))
    assert cli.main(["ask"]) == 0
    assert fake.sent[-1] == "café\nnaïve? \u4f60\u597d\ufffd"
    # a Latin-1 locale decodes stdin as Latin-1, as before
    monkeypatch.setattr("sys.stdin", piped("caf\xe9".encode("latin-1"), encoding="latin-1"))
    assert cli.main(["ask"]) == 0
    assert fake.sent[-1] == "café"
    monkeypatch.setattr("sys.stdin", piped(b" \n\t"))
    assert cli.main(["ask"]) == 2
    assert "the prompt read from stdin is empty" in capsys.readouterr().err


def test_piped_chat_reads_a_line_to_the_bound_not_on(fake, monkeypatch, capsys):
    """`hybridllm chat < /dev/zero`: input() read the one endless line whole."""
    source = Endless(8 * _chat_cli.MAX_STDIN_BYTES)
    monkeypatch.setattr("sys.stdin", piped(source))
    assert cli.main(["chat"]) == 2
    err = capsys.readouterr().err
    assert "a line read from stdin is over 4,194,304 characters" in err and err.count("\n") == 1
    assert source.given <= _chat_cli.MAX_STDIN_BYTES + 2**16
    assert fake.sent == []


def test_piped_chat_still_answers_each_line(fake, monkeypatch, capsys):
    # the last line without its newline, UTF-8, a byte that is not UTF-8, a blank line skipped
    monkeypatch.setattr("sys.stdin", piped("caf\u00e9?\r\n\n\u4f60\u597d".encode() + b"\xff"))
    assert cli.main(["chat"]) == 0
    assert [m[-1]["content"] for m in fake.sent] == ["caf\u00e9?", "\u4f60\u597d\ufffd"]
    assert capsys.readouterr().out == "an answer\n" * 2


def test_a_piped_question_at_the_bound_is_answered(fake, monkeypatch, capsys):
    at = _chat_cli.MAX_STDIN_BYTES
    monkeypatch.setattr("sys.stdin", piped(b"y" * at + b"\n" + b"z" * (at + 1) + b"\n"))
    assert cli.main(["chat"]) == 2  # the first line answered, the second refused
    assert [len(m[-1]["content"]) for m in fake.sent] == [at]
    assert "over 4,194,304 characters" in capsys.readouterr().err
