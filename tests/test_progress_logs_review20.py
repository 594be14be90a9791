"""A log record written to the terminal while a progress bar is drawn there starts a line of its
own (``_progress.log_lines_apart``), and the bar goes on below it.

Before: uvicorn's "Started server process", a warning or an access line written while the model's
"Preparing" bar was open was printed onto the bar's line, and the bar's next redraw ("\\r") went
over it. Fakes only: a StringIO that says it is a terminal, real logging handlers."""

from __future__ import annotations

import io
import logging
import sys
import threading

import pytest

from hybridllm import _progress
from hybridllm._progress import ProgressBar, log_lines_apart


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """No bar left open by another test, and a lastResort of the test's own (it is wrapped too)."""
    monkeypatch.setattr(_progress, "_open", None)
    monkeypatch.setattr(logging, "lastResort", logging._StderrHandler(logging.WARNING))
    monkeypatch.setenv("COLUMNS", "200")


def _logger_to(stream, name: str):
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(stream)
    logger.handlers = [handler]
    return logger, handler


def _unrolled(text: str) -> list[str]:
    """The terminal's lines: each ends at "\\n"; a "\\r" redraws the line from its start."""
    return [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]


def test_a_record_starts_a_line_of_its_own_and_the_bar_goes_on_below(monkeypatch):
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    logger, handler = _logger_to(tty, "review20.bar_logs")
    bar = ProgressBar("Preparing m", stream=tty, quiet_for=0)
    bar(1_000_000, 4_000_000)
    log_lines_apart()
    logger.info("Started server process [42]")
    bar._last_draw = float("-inf")  # the next update, past the redraw interval
    bar(2_000_000, 4_000_000)
    bar(4_000_000, 4_000_000)
    lines = _unrolled(tty.getvalue())
    assert lines[0].startswith("Preparing m [") and "25%" in lines[0], lines
    assert lines[1] == "Started server process [42]", lines
    assert lines[2].startswith("Preparing m [") and "100%" in lines[2] and lines[3:] == [""], lines
    assert _progress._open is None


def test_a_record_with_no_bar_open_is_written_as_before(monkeypatch):
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    logger, handler = _logger_to(tty, "review20.no_bar")
    log_lines_apart()
    log_lines_apart()  # a second call wraps nothing twice
    logger.warning("one")
    ProgressBar("Pulling m", stream=tty, quiet_for=0)(4, 4)  # a finished bar ended its own line
    logger.warning("two")
    assert tty.getvalue().split("\n")[0] == "one" and tty.getvalue().endswith("\ntwo\n")
    assert tty.getvalue().count("\n") == 3


def test_an_access_line_on_stdout_too(monkeypatch):
    """uvicorn's access handler writes to stdout, on the same terminal as the bar's stderr."""
    err, out = _Tty(), _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    logger, _ = _logger_to(out, "review20.access")
    ProgressBar("Preparing m", stream=err, quiet_for=0)(1, 4)
    log_lines_apart()
    logger.info('"GET /health HTTP/1.1" 503')
    assert err.getvalue().endswith("\n") and _progress._open is None
    assert out.getvalue() == '"GET /health HTTP/1.1" 503\n'


def test_nothing_changes_when_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    tty = _Tty()
    logger, handler = _logger_to(tty, "review20.piped")
    log_lines_apart()
    assert "emit" not in vars(handler) and "emit" not in vars(logging.lastResort)


def test_a_bar_drawn_from_the_loading_thread_waits_for_the_record(monkeypatch):
    """The bar is drawn from the model's loading thread: had it drawn between the record's line end
    and the record, the record would follow the bar again. It waits for the record instead."""
    go, drawn = threading.Event(), threading.Event()

    class Tty(_Tty):
        def write(self, text: str) -> int:
            if text.startswith("Waiting"):  # the record, its line begun: the loader draws now if it may
                go.set()
                drawn.wait(0.3)
            return super().write(text)

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    logger, _ = _logger_to(tty, "review20.threads")
    bar = ProgressBar("Preparing m", stream=tty, quiet_for=0)
    bar(1, 4)
    log_lines_apart()

    def load() -> None:
        go.wait(5)
        bar._last_draw = float("-inf")
        bar(2, 4)
        drawn.set()

    loader = threading.Thread(target=load)
    loader.start()
    logger.warning("Waiting for application startup.")
    loader.join(5)
    lines = tty.getvalue().split("\n")
    assert lines[1] == "Waiting for application startup.", lines
    assert lines[2].startswith("\rPreparing m [") and "50%" in lines[2], lines
    bar.close()


def test_hybridllm_serve_ends_the_bar_line_before_a_warning(monkeypatch, tmp_path):
    """`hybridllm serve` loads its edge model before uvicorn's logging is set up: a warning then
    goes to logging.lastResort (stderr), which now ends the bar's line first."""
    pytest.importorskip("fastapi")
    from hybridllm import HybridLLM, cli
    from hybridllm.backends.fake import FakeBackend

    monkeypatch.setenv("HOME", str(tmp_path))  # no config.toml of the machine's
    monkeypatch.delenv("HYBRIDLLM_CONFIG", raising=False)
    monkeypatch.delenv("HYBRIDLLM_SERVE_API_KEYS", raising=False)
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "hi"), cache=False)

    def loading(progress, **kw):
        progress._shown = True  # drawn from the first call
        progress(1_000_000, 4_000_000)
        logging.getLogger("hybridllm.review20").warning("the router's model is missing: using the rule")
        progress._last_draw = float("-inf")
        progress(4_000_000, 4_000_000)
        return llm

    class Server:
        def __init__(self, *a, **k) -> None:
            pass

        def run(self, sockets) -> None:
            pass

    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    monkeypatch.setattr(logging.root, "handlers", [])  # a CLI run: no handler (pytest adds its own)
    monkeypatch.setattr("hybridllm._client.HybridLLM", loading)
    monkeypatch.setattr("hybridllm.wire.shutdown.GracefulServer", Server)
    assert cli.main(["serve", "--port", "0"]) == 0
    lines = _unrolled(tty.getvalue())
    assert lines[0].startswith("Preparing the edge model [") and "25%" in lines[0], lines
    assert lines[1] == "the router's model is missing: using the rule", lines
    assert "100%" in lines[2] and lines[3:] == [""], lines
