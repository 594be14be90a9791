"""CLI review 15b: a piped chat whose line is refused as an unknown command says so in its exit
status, and output that cannot be written (a full disk) is one error line, not an internal error."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
import textwrap
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
        Client.sent.append(messages[-1]["content"])
        return Stream("answer")


class Piped(io.StringIO):
    def isatty(self):
        return False


@pytest.fixture
def client(monkeypatch, tmp_path):
    Client.sent = []
    (tmp_path / "none.toml").write_text("")
    monkeypatch.setenv("HYBRIDLLM_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setattr("hybridllm._client.HybridLLM", Client)
    return Client


def test_a_piped_line_refused_as_an_unknown_command_fails_the_chat(client, monkeypatch, capsys):
    """Before: `printf '/etc\\nq\\n' | hybridllm chat` answered only q and exited 0, so a script
    never learned that one of its questions was dropped (a failed turn exits 1)."""
    monkeypatch.setattr("sys.stdin", Piped("/etc\nq\n"))
    assert cli.main(["chat"]) == 1
    out, err = capsys.readouterr()
    assert "unknown command /etc" in err and client.sent == ["q"] and out == "answer\n"


def test_known_commands_in_a_piped_chat_still_exit_0(client, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", Piped("/help\nq\n/reset\n/exit\nnot read\n"))
    assert cli.main(["chat"]) == 0
    assert client.sent == ["q"]


def test_an_unknown_command_on_a_terminal_keeps_exit_0(client, monkeypatch, capsys):
    lines = ["/rest", "q"]

    def fake_input(prompt=""):
        if not lines:
            raise EOFError
        return lines.pop(0)

    monkeypatch.setattr("builtins.input", fake_input)
    monkeypatch.setattr("sys.stdin", SimpleNamespace(isatty=lambda: True))
    assert cli.main(["chat"]) == 0  # the person saw the note and typed on
    assert client.sent == ["q"]


class FullDisk(io.StringIO):
    """A stdout on a full disk: every write (or the flush of what was buffered) fails."""

    def __init__(self, on_flush: bool):
        super().__init__()
        self.on_flush = on_flush

    def write(self, text):
        if not self.on_flush:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(text)

    def flush(self):
        if self.on_flush and self.getvalue():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("on_flush", [False, True])
def test_output_to_a_full_disk_is_one_error_line_exit_1(monkeypatch, capsys, on_flush):
    """Before: `hybridllm models list > file` on a full disk said "internal error: OSError ... please
    report it" (a write), or ended in a traceback (the last flush, outside the error handling)."""
    monkeypatch.setattr("sys.stdout", FullDisk(on_flush))
    monkeypatch.setattr(cli, "cmd_models_list", lambda args: print("a row") or 0)
    monkeypatch.delenv("HYBRIDLLM_DEBUG", raising=False)
    assert cli.main(["models", "list"]) == 1
    err = capsys.readouterr().err
    assert err == "error: cannot write the output: No space left on device\n"


def test_other_unexpected_errors_are_still_internal_errors(monkeypatch, capsys):
    def boom(args):
        raise OSError(errno.EINVAL, "odd")

    monkeypatch.setattr(cli, "cmd_models_list", boom)
    monkeypatch.delenv("HYBRIDLLM_DEBUG", raising=False)
    assert cli.main(["models", "list"]) == 1
    assert capsys.readouterr().err.startswith("internal error: OSError")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_ask_into_dev_full_says_so_without_a_traceback(tmp_path):
    """The same through a real process: `hybridllm ask --json q > /dev/full`."""
    fake = textwrap.dedent("""
        import sys
        import hybridllm._client
        from hybridllm import Completion

        class Fake:
            def __init__(self, **kw):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                pass

            def chat(self, messages, **params):
                return Completion(text="x", route="edge", reason="r", model="m")

        hybridllm._client.HybridLLM = Fake
        from hybridllm import cli
        sys.exit(cli.main(sys.argv[1:]))
    """)
    (tmp_path / "none.toml").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYBRIDLLM_")}
    env.update(HYBRIDLLM_HOME=str(tmp_path / "home"), HYBRIDLLM_CONFIG=str(tmp_path / "none.toml"))
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-c", fake, "ask", "--json", "q"], stdout=full,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, timeout=60,
                              text=True)
    assert done.stderr == "error: cannot write the output: No space left on device\n", done.stderr
    assert done.returncode == 1
