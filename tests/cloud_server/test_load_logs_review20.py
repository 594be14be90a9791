"""`hybridllm-cloud serve`: uvicorn's log lines written while the model's "Preparing" bar is drawn
(the model loads while uvicorn serves) start a line of their own, and the bar goes on below them.

Before: "Started server process", "Waiting for application startup." and the like were printed
onto the bar's line and the bar redrew over them. In-process, no model: uvicorn's real logging
config on a stderr that says it is a terminal; the server's run draws the bar and logs."""

from __future__ import annotations

import io
import logging
import sys
from typing import Any

import pytest

import cloud_server.__main__ as cli
from cloud_server.__main__ import build_parser
from cloud_server.api.auth import API_KEYS_ENV
from hybridllm import _progress
from hybridllm._progress import ProgressBar


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(_progress, "_open", None)
    monkeypatch.setattr(logging, "lastResort", logging._StderrHandler(logging.WARNING))
    monkeypatch.setenv("COLUMNS", "200")


def _serve_with(monkeypatch, run) -> None:
    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    for name in ("_check_model", "_check_model_header", "_check_device"):
        monkeypatch.setattr(cli, name, lambda *a, **k: None)

    class Server:
        def __init__(self, config: Any, drain: Any, grace_s: float) -> None:
            pass

        def run(self, sockets: Any) -> None:
            run()

    monkeypatch.setattr("hybridllm.wire.shutdown.GracefulServer", Server)
    args = build_parser().parse_args(["serve", "--model", "smollm2-135m-instruct", "--port", "0",
                                      "--log-level", "info"])
    assert cli.serve(args) == 0


def test_uvicorns_lines_start_their_own_line_while_the_bar_is_drawn(monkeypatch):
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)  # uvicorn's config takes ext://sys.stderr
    bar = ProgressBar("Preparing smollm2-135m-instruct", quiet_for=0)

    def run() -> None:  # the load's thread draws while uvicorn starts
        bar(49_000_000, 98_000_000)
        logging.getLogger("uvicorn.error").info("Started server process [42]")
        bar._last_draw = float("-inf")
        bar(98_000_000, 98_000_000)

    _serve_with(monkeypatch, run)
    lines = [x.rsplit("\r", 1)[-1] for x in tty.getvalue().split("\n")]
    assert lines[0].startswith("Preparing smollm2-135m-instruct [") and "50%" in lines[0], lines
    assert lines[1] == "INFO:     Started server process [42]", lines
    assert "100%" in lines[2] and lines[3:] == [""], lines
