"""A pull cut short (an error, Ctrl-C) while its progress bar is drawn on a terminal ends the bar's
line first: `error: ...` / `interrupted` used to follow the unfinished bar on the same line. Fakes
only: the pull is a stand-in that draws part of a bar and then fails."""

from __future__ import annotations

import io
import sys

import pytest

from hybridllm import _progress, cli
from hybridllm._exceptions import ModelError
from hybridllm._progress import ProgressBar
from hybridllm.models import store


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class _NowBar(ProgressBar):
    """Shown from the first call (the CLI's bar waits a second before it draws)."""

    def __init__(self, label: str, **kw) -> None:
        super().__init__(label, **{**kw, "quiet_for": 0})


def _on_tty(monkeypatch) -> _Tty:
    """stderr a terminal, stdout a pipe. Set in the test itself: pytest's capture puts its own
    streams back between a fixture's setup and the test."""
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(_progress, "ProgressBar", _NowBar)
    monkeypatch.setenv("COLUMNS", "200")
    return err


def _failing_pull(exc: BaseException):
    def pull(model_id, *, progress=None, force=False, on_wait=None):
        progress(1_000_000, 4_000_000)  # a quarter drawn, no line end yet
        raise exc
    return pull


@pytest.mark.parametrize("argv", [["models", "pull", "smollm2-135m-instruct"],
                                  ["models", "path", "smollm2-135m-instruct"],
                                  ["models", "prepare", "smollm2-135m-instruct"]])
def test_an_error_starts_its_own_line_after_a_drawn_bar(monkeypatch, argv):
    tty = _on_tty(monkeypatch)
    monkeypatch.setattr(store, "pull", _failing_pull(ModelError("Cannot copy x (No space left)")))
    assert cli.main(argv) == 1
    lines = tty.getvalue().split("\n")
    assert lines[0].startswith("\rPulling smollm2-135m-instruct [") and "25%" in lines[0]
    assert lines[1] == "error: Cannot copy x (No space left)" and lines[2:] == [""]
    assert sys.stdout.getvalue() == ""  # no path printed for a pull that failed


def test_ctrl_c_starts_its_own_line_after_a_drawn_bar(monkeypatch):
    tty = _on_tty(monkeypatch)
    monkeypatch.setattr(store, "pull", _failing_pull(KeyboardInterrupt()))
    assert cli.main(["models", "pull", "smollm2-135m-instruct"]) == 130
    assert tty.getvalue().split("\n")[1:] == ["interrupted", ""]


def test_an_internal_error_too(monkeypatch):
    tty = _on_tty(monkeypatch)
    monkeypatch.delenv("HYBRIDLLM_DEBUG", raising=False)
    monkeypatch.setattr(store, "pull", _failing_pull(RuntimeError("boom")))
    assert cli.main(["models", "pull", "smollm2-135m-instruct"]) == 1
    assert tty.getvalue().split("\n")[1].startswith("internal error: RuntimeError: boom")


def test_close_ends_only_an_unfinished_terminal_line():
    bar = ProgressBar("Pulling m", stream=_Tty(), quiet_for=0)
    bar.close()  # nothing drawn: nothing written
    assert bar.stream.getvalue() == ""
    bar(1, 2)
    bar.close()
    bar.close()  # once only
    assert bar.stream.getvalue().count("\n") == 1 and bar.stream.getvalue().endswith("\n")
    done = ProgressBar("Pulling m", stream=_Tty(), quiet_for=0)
    done(2, 2)
    done.close()  # its final line already ended
    assert done.stream.getvalue().count("\n") == 1
    log = ProgressBar("Pulling m", stream=io.StringIO(), quiet_for=0)
    log(1, 2)
    log.close()  # not a terminal: every line printed whole already
    assert log.stream.getvalue().count("\n") == 1


def test_a_bar_of_unknown_total_is_ended_when_the_command_returns(monkeypatch):
    tty = _on_tty(monkeypatch)
    """A total of None never draws a final line: the command's output followed the bar."""
    def pull(model_id, *, progress=None, force=False, on_wait=None):
        progress(3_000_000, None)
        return "/data/m.gguf"
    monkeypatch.setattr(store, "pull", pull)
    assert cli.main(["models", "pull", "smollm2-135m-instruct"]) == 0
    assert tty.getvalue().endswith("\n") and tty.getvalue().count("\n") == 1
    assert sys.stdout.getvalue() == "/data/m.gguf\n"
