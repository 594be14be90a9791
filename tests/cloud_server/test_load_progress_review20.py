"""The cloud server's bar while it assembles a catalog model (`hybridllm-cloud serve --model ID`
on its first run) ends its terminal line on every way out: a failed or interrupted load, an error
printed by the CLI, a shutdown while loading. Fakes only: nothing is pulled or loaded."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

import pytest

import cloud_server.__main__ as cloud_main
import hybridllm.models
from cloud_server.exceptions import ModelLoadError, ServerError
from cloud_server.models.loader import resolve_model_path
from hybridllm import _progress
from hybridllm._exceptions import ModelCorruptError
from hybridllm._progress import ProgressBar

MODEL = "smollm2-135m-instruct"  # only its catalog entry is read


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _no_open_bar(monkeypatch):
    monkeypatch.setattr(_progress, "_open", None)
    monkeypatch.setenv("COLUMNS", "200")


def _on_terminal(monkeypatch) -> _Tty:
    """stderr a terminal (set in the test: pytest's capture sets its own after the fixtures), bars
    drawn from the first call."""
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setitem(ProgressBar.__init__.__kwdefaults__, "quiet_for", 0.0)
    return err


def _pull_that_stops(exc: BaseException):
    def pull(model, *, progress=None, force=False):
        progress(40_000_000, 98_000_000)
        raise exc
    return pull


@pytest.mark.parametrize("exc", [ModelCorruptError("the packaged file has sha256 0, expected 1"),
                                 OSError(28, "No space left on device")])
def test_a_failed_assembly_ends_the_bar_line_before_the_error(monkeypatch, exc):
    """Before: the bar's line stayed open, so the log's "loading the model failed: ..." was
    printed after "Preparing smollm2-135m-instruct [####   ] 40% ..." on the same line."""
    err = _on_terminal(monkeypatch)
    monkeypatch.setattr(hybridllm.models, "pull", _pull_that_stops(exc))
    with pytest.raises(ModelLoadError, match="cannot resolve model"):
        resolve_model_path(MODEL)
    drawn = err.getvalue()
    assert drawn.startswith(f"\rPreparing {MODEL} [") and drawn.endswith("\n") and drawn.count("\n") == 1
    assert _progress._open is None


def test_ctrl_c_while_assembling_ends_the_bar_line(monkeypatch):
    err = _on_terminal(monkeypatch)
    monkeypatch.setattr(hybridllm.models, "pull", _pull_that_stops(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        resolve_model_path(MODEL)
    assert err.getvalue().endswith("\n") and _progress._open is None


def test_a_finished_assembly_ends_its_line_once(monkeypatch, tmp_path):
    err = _on_terminal(monkeypatch)

    def pull(model, *, progress=None, force=False):
        progress(98_000_000, 98_000_000)
        return tmp_path / "m.gguf"

    monkeypatch.setattr(hybridllm.models, "pull", pull)
    assert resolve_model_path(MODEL) == (MODEL, tmp_path / "m.gguf")
    assert err.getvalue().count("\n") == 1 and "100%" in err.getvalue()


def test_the_cli_error_starts_a_line_of_its_own(monkeypatch):
    """A bar left open when `serve` fails: `hybridllm-cloud: error: ...` used to follow it on the
    same line (hybridllm's own CLI ends it; this one did not)."""
    err = _on_terminal(monkeypatch)

    def serve(args):
        ProgressBar("Preparing x")(1, 10)
        raise ServerError("loading model 'x' failed: boom")

    monkeypatch.setattr(cloud_main, "serve", serve)
    assert cloud_main.main(["serve", "--model", "x"]) == 1
    assert err.getvalue().split("\n")[1:] == ["hybridllm-cloud: error: loading model 'x' failed: boom", ""]


def test_a_shutdown_while_loading_logs_on_a_line_of_its_own(monkeypatch):
    """Ctrl-C while the model loads: the load's thread cannot be stopped and its bar is still
    open; the "shut down while the model was loading" line used to follow it, and the shell's
    prompt came after the bar's last drawing."""
    err = _on_terminal(monkeypatch)
    handler = logging.StreamHandler(err)
    logger = logging.getLogger("cloud_server")
    monkeypatch.setattr(logger, "level", logging.INFO)
    logger.addHandler(handler)
    monkeypatch.setattr(logging, "shutdown", lambda: ProgressBar("Preparing x")(3, 10))  # drawn again

    def exit_(status):
        raise SystemExit(status)

    monkeypatch.setattr(cloud_main.os, "_exit", exit_)
    ProgressBar("Preparing x")(2, 10)
    try:
        with pytest.raises(SystemExit):
            cloud_main._exit_leaving_the_load()
    finally:
        logger.removeHandler(handler)
    lines = err.getvalue().split("\n")
    assert lines[1] == "shut down while the model was loading: not waiting for it", lines
    assert lines[-1] == "" and _progress._open is None


def test_a_path_is_not_pulled_and_draws_nothing(monkeypatch, tmp_path):
    err = _on_terminal(monkeypatch)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model_path(str(gguf)) == ("m", Path(gguf))
    assert err.getvalue() == ""
