"""Whatever is written to the terminal while a progress bar is drawn there starts a line of its own
(``_progress.log_lines_apart``), not only the records of the log handlers there when it was called.

Before: a ``warnings.warn`` (Python's default printer, on stderr), a record of a handler added after
the call (uvicorn's, set up from ``ext://sys.stderr`` / ``ext://sys.stdout`` when its Config is
made; a library's own handler) and a ``print`` to stderr were written onto the bar's line, and the
bar's next redraw ("\\r") went over them; `hybridllm ask` / `chat` did not call it at all, so a
warning logged while "Preparing" was drawn followed the bar. Fakes only: a StringIO that says it
is a terminal, real logging and warnings."""

from __future__ import annotations

import io
import logging
import logging.config
import subprocess
import sys
import textwrap

import pytest

from hybridllm import _progress
from hybridllm._progress import ProgressBar, log_lines_apart


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """No bar left open by another test; stderr and stdout put back whatever the test makes them."""
    monkeypatch.setattr(_progress, "_open", None)
    monkeypatch.setattr(logging, "lastResort", logging._StderrHandler(logging.WARNING))
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setenv("COLUMNS", "200")


def _unrolled(text: str) -> list[str]:
    """The terminal's lines: each ends at "\\n"; a "\\r" redraws the line from its start."""
    return [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]


def _drawn(tty, label: str = "Preparing m") -> ProgressBar:
    bar = ProgressBar(label, stream=tty, quiet_for=0)
    bar(1_000_000, 4_000_000)
    return bar


def _finished(bar: ProgressBar) -> None:
    bar._last_draw = float("-inf")  # the next update, past the redraw interval
    bar(4_000_000, 4_000_000)


def _assert_apart(text: str, middle: list[str]) -> None:
    lines = _unrolled(text)
    assert lines[0].startswith("Preparing m [") and "25%" in lines[0], lines
    assert lines[1:1 + len(middle)] == middle, lines
    rest = lines[1 + len(middle):]
    assert rest[0].startswith("Preparing m [") and "100%" in rest[0] and rest[1:] == [""], lines


_WARNS = textwrap.dedent("""
    import io, sys, warnings
    from hybridllm._progress import ProgressBar, log_lines_apart

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = sys.stderr = Tty()
    filters = list(warnings.filters)
    bar = ProgressBar("Preparing m", quiet_for=0)  # on sys.stderr, as the CLI's bars
    bar(1_000_000, 4_000_000)
    log_lines_apart()
    assert warnings.filters == filters and warnings.showwarning is warnings._showwarning_orig
    warnings.warn("the tokenizer is slow", UserWarning, stacklevel=1)
    bar._last_draw = float("-inf")
    bar(4_000_000, 4_000_000)
    sys.__stdout__.write(repr(tty.getvalue()))
""")


def test_a_warning_starts_a_line_of_its_own():
    """Python's own warning printer (a child process: pytest records warnings instead), its filters
    and showwarning untouched: the warning is printed whole, on a line after the bar's."""
    out = subprocess.run([sys.executable, "-W", "default", "-c", _WARNS], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = _unrolled(eval(out.stdout))
    assert lines[0].startswith("Preparing m [") and "25%" in lines[0], lines
    assert lines[1].endswith("UserWarning: the tokenizer is slow"), lines
    assert "100%" in lines[-2] and lines[-1] == "", lines


def test_a_handler_configured_after_the_call(monkeypatch):
    """As uvicorn's Config does (dictConfig, its stream ext://sys.stderr) after `hybridllm serve`'s
    call; the bar's final line goes on below."""
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    bar = _drawn(tty)
    log_lines_apart()
    monkeypatch.setattr(logging.getLogger("review21.uvicorn"), "handlers", [])  # put back after
    logging.config.dictConfig({
        "version": 1, "disable_existing_loggers": False,
        "handlers": {"default": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}},
        "loggers": {"review21.uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False}},
    })
    logging.getLogger("review21.uvicorn").info("Started server process [42]")
    _finished(bar)
    _assert_apart(tty.getvalue(), ["Started server process [42]"])


def test_a_library_handler_added_later_and_a_print(monkeypatch):
    """A library's own handler made after the call (StreamHandler(): sys.stderr), and a plain
    print to stderr (the CLI's notes)."""
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    bar = _drawn(tty)
    log_lines_apart()
    logger = logging.getLogger("review21.library")
    monkeypatch.setattr(logger, "handlers", [logging.StreamHandler()])
    monkeypatch.setattr(logger, "propagate", False)
    logger.warning("weights not tied")
    bar._last_draw = float("-inf")
    bar(2_000_000, 4_000_000)
    print("a note", file=sys.stderr)
    _finished(bar)
    lines = _unrolled(tty.getvalue())
    assert lines[1] == "weights not tied" and "50%" in lines[2] and lines[3] == "a note", lines
    assert "100%" in lines[4] and lines[5:] == [""], lines


def test_an_access_line_on_stdout_from_a_handler_added_later(monkeypatch):
    """uvicorn's access handler writes to ext://sys.stdout, the same terminal as the bar's stderr."""
    err, out = _Tty(), _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", out)
    _drawn(err)
    log_lines_apart()
    logger = logging.getLogger("review21.access")
    monkeypatch.setattr(logger, "handlers", [logging.StreamHandler(sys.stdout)])
    monkeypatch.setattr(logger, "propagate", False)
    logger.warning('"GET /health HTTP/1.1" 503')
    assert err.getvalue().endswith("\n") and _progress._open is None
    assert out.getvalue() == '"GET /health HTTP/1.1" 503\n'


def test_a_bar_on_the_wrapped_stderr_redraws_on_its_own_line(monkeypatch):
    """A bar made after the call (its stream sys.stderr by default) draws on the terminal itself:
    its redraws do not end its own line, and the streams are wrapped once however often it is
    called. A guard: this held before the change too."""
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    log_lines_apart()
    wrapped = sys.stderr
    log_lines_apart()
    assert sys.stderr is wrapped and sys.stderr.isatty() and sys.stderr.getvalue() == ""
    bar = ProgressBar("Preparing m", quiet_for=0)
    for done in (1, 2, 3):
        bar._last_draw = float("-inf")
        bar(done * 1_000_000, 4_000_000)
    _finished(bar)
    assert tty.getvalue().count("\n") == 1 and tty.getvalue().count("\r") == 4


def test_nothing_changes_when_stderr_is_not_a_terminal(monkeypatch):
    piped, out = io.StringIO(), _Tty()
    monkeypatch.setattr(sys, "stderr", piped)
    monkeypatch.setattr(sys, "stdout", out)
    log_lines_apart()
    assert sys.stderr is piped and sys.stdout is out


def test_a_piped_stdout_is_left_as_it_is(monkeypatch):
    """Answers piped on (`hybridllm ask q | jq`): stdout stays the very stream it was."""
    tty, piped = _Tty(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", tty)
    monkeypatch.setattr(sys, "stdout", piped)
    log_lines_apart()
    assert sys.stdout is piped and sys.stderr is not tty


def test_hybridllm_ask_ends_the_bar_line_before_a_warning(monkeypatch, tmp_path):
    """`hybridllm ask` loads its model under a "Preparing" bar; a warning logged meanwhile (to
    logging.lastResort: the CLI configures no logging) starts a line of its own."""
    from hybridllm import HybridLLM, cli
    from hybridllm.backends.fake import FakeBackend

    monkeypatch.setenv("HOME", str(tmp_path))  # no config.toml of the machine's
    monkeypatch.delenv("HYBRIDLLM_CONFIG", raising=False)
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "hi"), cache=False)

    def loading(progress, **kw):
        progress._shown = True  # drawn from the first call
        progress(1_000_000, 4_000_000)
        logging.getLogger("hybridllm.review21").warning("the router's model is missing: using the rule")
        progress._last_draw = float("-inf")
        progress(4_000_000, 4_000_000)
        return llm

    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    monkeypatch.setattr(logging.root, "handlers", [])  # a CLI run: no handler (pytest adds its own)
    monkeypatch.setattr("hybridllm._client.HybridLLM", loading)
    assert cli.main(["ask", "hello"]) == 0
    lines = _unrolled(tty.getvalue())
    assert lines[0].startswith("Preparing ") and "25%" in lines[0], lines
    assert lines[1] == "the router's model is missing: using the rule", lines
    assert "100%" in lines[2], lines
