"""`hybridllm ... | head -1`: a reader that closes the pipe early gets no traceback from the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# a fake client that streams many lines, then the real CLI's main()
FAKE = textwrap.dedent("""
    import sys
    import hybridllm._client
    from hybridllm import Chunk, Completion

    class Stream:
        completion = None

        def __iter__(self):
            for i in range(2000):
                yield Chunk(text=f"line {i}\\n", route="edge", model="m")
            self.completion = Completion(text="x", route="edge", reason="r", model="m")

    class Fake:
        def __init__(self, **kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def stream(self, messages, **params):
            return Stream()

        def chat(self, messages, **params):
            return Completion(text="x" * 100, route="edge", reason="r", model="m")

    hybridllm._client.HybridLLM = Fake
    from hybridllm import cli
    sys.exit(cli.main(sys.argv[1:]))
""")


@pytest.mark.parametrize("argv", [["ask", "hi"], ["ask", "hi", "--json"], ["--help"], ["ask", "--help"]])
def test_a_closed_pipe_is_not_a_traceback(tmp_path, argv):
    """Before: with stdout block-buffered (a pipe, no PYTHONUNBUFFERED) what was left in the buffer
    failed at interpreter exit: "Exception ignored ... BrokenPipeError" on stderr, exit status 120."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env.update(HYBRIDLLM_HOME=str(tmp_path / "home"), HYBRIDLLM_CONFIG=str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text("")
    read, write = os.pipe()
    os.close(read)  # the reader has gone (`| head -1` after its line) before anything is written
    try:
        done = subprocess.run([sys.executable, "-c", FAKE, *argv], stdout=write, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, env=env, timeout=120, text=True)
    finally:
        os.close(write)
    assert "BrokenPipeError" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "internal error" not in done.stderr
    assert done.returncode == 0


def test_ctrl_c_mid_answer_ends_its_line_and_exits_130(monkeypatch, capsys):
    """Before: `hybridllm ask` stopped by Ctrl-C left the partial answer without its newline, so
    the output (a file it was redirected to) ended mid-line and the shell prompt was glued on."""
    from hybridllm import Chunk, cli

    class Stream:
        completion = None

        def __iter__(self):
            yield Chunk(text="the start of", route="edge", model="m")
            raise KeyboardInterrupt

    class Fake:
        def __init__(self, **kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def stream(self, messages, **params):
            return Stream()

    monkeypatch.setattr("hybridllm._client.HybridLLM", Fake)
    assert cli.main(["ask", "hi"]) == 130
    out, err = capsys.readouterr()
    assert out == "the start of\n"
    assert err.strip() == "interrupted" and "Traceback" not in err


def test_ctrl_c_mid_answer_ends_a_piped_chat(monkeypatch, capsys):
    """Before: a piped chat (`hybridllm chat < questions.txt`) stopped by Ctrl-C mid-answer went on
    to the next question, so a script took one Ctrl-C per line; at its next read it quits (130)."""
    from hybridllm import cli
    from tests.test_cli import ChatFake, FakeEdge, FakeStream, Terminal

    ChatFake.sent, ChatFake.edge = [], FakeEdge()
    ChatFake.answers = [FakeStream(["Once ", "upon ", "a time"], interrupt_after=2)]
    monkeypatch.setattr("hybridllm._client.HybridLLM", ChatFake)
    monkeypatch.setattr("sys.stdin", Terminal(False, ["tell a story", "and another"]))
    assert cli.main(["chat"]) == 130
    out, err = capsys.readouterr()
    assert out == "Once upon \n" and err.strip().splitlines()[-1] == "interrupted"
    assert len(ChatFake.sent) == 1  # the second question was not asked
