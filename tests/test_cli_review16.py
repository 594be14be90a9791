"""CLI review 16: --stop refused as a usage error naming it, the chat's prompt kept out of a
redirected stdout, and `python -m hybridllm.cli` exiting as the `hybridllm` command does."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from hybridllm import cli


class Stream:
    def __init__(self, text):
        self.text, self.completion = text, None

    def __iter__(self):
        from hybridllm import Chunk, Completion

        yield Chunk(text=self.text, route="edge", model="fake")
        self.completion = Completion(text=self.text, route="edge", reason="r", model="fake")


class Client:
    """Stands in for HybridLLM: device only, answers every question."""

    sent: list = []

    def __init__(self, **kw):
        self.cloud = None
        self.config = SimpleNamespace(max_tokens=256)
        self.edge = SimpleNamespace(model="fake", context_length=None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def stream(self, messages, **params):
        Client.sent.append(messages if isinstance(messages, str) else messages[-1]["content"])
        return Stream("answer")


class Terminal(io.StringIO):
    """stdin on a terminal: the real input() reads it with readline() (it is no real descriptor)."""

    def isatty(self):
        return True


@pytest.fixture
def client(monkeypatch, tmp_path):
    Client.sent = []
    (tmp_path / "none.toml").write_text("")
    monkeypatch.setenv("HYBRIDLLM_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setattr("hybridllm._client.HybridLLM", Client)
    return Client


@pytest.mark.parametrize("command", [["ask", "hi"], ["chat"]])
def test_an_empty_stop_string_is_a_usage_error_naming_the_option(client, monkeypatch, capsys, command):
    """Before: `hybridllm ask --stop "" hi` printed "error: stop must be a string or a list of
    non-empty strings." and exited 1, unlike every other bad sampling option (exit 2, named)."""
    def no_client(**kw):
        raise AssertionError("the client was built")

    monkeypatch.setattr("hybridllm._client.HybridLLM", no_client)
    with pytest.raises(SystemExit) as exit_:
        cli.main([command[0], "--stop", "\n", "--stop", "", *command[1:]])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --stop: a stop string cannot be empty" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("command", [["ask", "hi"], ["chat"]])
def test_too_many_stop_strings_are_a_usage_error_naming_the_option(client, monkeypatch, capsys, command):
    monkeypatch.setattr("sys.stdin", Terminal(""))
    stops = [arg for i in range(5) for arg in ("--stop", f"s{i}")]
    assert cli.main([command[0], *stops, *command[1:]]) == 2
    err = capsys.readouterr().err
    assert err == f"hybridllm {command[0]}: error: argument --stop: at most 4 stop strings, got 5.\n"
    assert client.sent == []
    assert cli.main([command[0], *stops[:8], *command[1:]]) == 0  # four are fine


def test_the_prompt_stays_out_of_a_redirected_stdout(client, monkeypatch, capsys):
    """Before: `hybridllm chat > answers.txt` on a terminal wrote a 'you> ' prompt into the file
    before every answer (input() writes its prompt to stdout), and the newline after Ctrl-D too."""
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr("sys.stdin", Terminal("first\nsecond\n"))
    assert cli.main(["chat"]) == 0
    out, err = capsys.readouterr()
    assert out == "answer\nanswer\n"
    assert err.count("you> ") == 3 and "\x1b[" not in err  # stderr is no terminal here either
    assert client.sent == ["first", "second"]


def test_python_m_hybridllm_cli_exits_2_on_a_usage_error_found_by_a_command_group(tmp_path):
    """Before: under `python -m hybridllm.cli`, `serve --config missing.toml` exited 1: the file
    ran as __main__, a second copy whose _UsageError was not the class _serve_cli raised."""
    pytest.importorskip("uvicorn")
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("HYBRIDLLM_CONFIG", None)
    env.pop("HYBRIDLLM_SERVE_API_KEYS", None)
    run = subprocess.run([sys.executable, "-m", "hybridllm.cli", "serve", "--port", "0", "--config",
                          str(tmp_path / "missing.toml")], capture_output=True, text=True, env=env,
                         timeout=60)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("hybridllm serve: error: ") and "does not exist" in run.stderr


class Broken(Stream):
    """An answer that fails after its first words (a cloud stream cut off mid-answer)."""

    def __iter__(self):
        from hybridllm import Chunk, CloudError

        yield Chunk(text="Once upon", route="cloud", model="fake")
        raise CloudError("the cloud stream ended mid-answer")


def test_an_answer_that_fails_half_way_ends_its_line_before_the_error(client, monkeypatch, capsys):
    """Before: `hybridllm ask q` left stdout at "Once upon" with no newline, so on a terminal the
    error line was glued to the partial answer ("Once uponerror: ...") and a file had no last
    newline; Ctrl-C there already ended the line."""
    monkeypatch.setattr(Client, "stream", lambda self, messages, **params: Broken(""))
    assert cli.main(["ask", "tell a story"]) == 1
    out, err = capsys.readouterr()
    assert out == "Once upon\n"
    assert err == "error: the cloud stream ended mid-answer\n"


def test_an_answer_a_non_utf8_stdout_cannot_encode_is_escaped_not_an_internal_error(
        client, monkeypatch, capsys):
    """Before: with stdout in Latin-1 or ASCII (a Latin-1 locale, a redirect on Windows in cp1252),
    `hybridllm ask q` whose answer held a character outside it ended "internal error:
    UnicodeEncodeError ... please report it", exit 1, the answer lost."""
    monkeypatch.setattr(Client, "stream", lambda self, messages, **params: Stream("café ☕"))
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="ascii")
    monkeypatch.setattr("sys.stdout", stdout)
    assert cli.main(["ask", "q"]) == 0
    stdout.flush()
    assert raw.getvalue() == b"caf\\xe9 \\u2615\n"
    assert "internal error" not in capsys.readouterr().err
