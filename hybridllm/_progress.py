"""A small progress bar for long work in the CLI (materializing models, exporting, embedding,
labelling): the amount done, the rate and the time left."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO, cast

from ._cli_terminal import _isatty
from ._durations import duration

# the bar whose terminal line is drawn but not yet ended (work cut short by an error or Ctrl-C,
# a total never known); one at most, as a terminal has one current line
_open: ProgressBar | None = None
# held while a bar draws on a terminal and while a log record or other text is written to one
# (log_lines_apart): the bar is drawn from a loading thread, and neither may write between the
# other's line end and line
_lock = threading.RLock()


def end_line() -> None:
    """End the line of a bar left unfinished on a terminal, so that what is printed next (the
    CLI's ``error: ...`` or ``interrupted``, a path) starts a line of its own, not after the bar."""
    with _lock:
        bar = _open  # read once: another thread may end it meanwhile
        if bar is not None:
            bar.close()


def log_lines_apart() -> None:
    """Make what is written to the terminal (stderr or stdout) end the line of a bar drawn there
    first, so that it starts a line of its own (uvicorn's ``Started server process``, a log
    record, a ``warnings.warn``, an access line while the model loads) and the bar goes on below it
    at its next update. ``sys.stderr`` and ``sys.stdout`` become streams that do so (a handler
    added later, a warning, a ``print`` write through them), and the handlers already holding the
    terminal do so per record. Calling again is harmless. Nothing changes when stderr, where the
    bars are drawn, is not a terminal."""
    if not _isatty(sys.stderr):
        return
    sys.stderr, sys.stdout = _apart(sys.stderr), _apart(sys.stdout)
    handlers = [*logging.getLogger().handlers, logging.lastResort]
    for logger in list(logging.Logger.manager.loggerDict.values()):
        handlers += getattr(logger, "handlers", [])  # a PlaceHolder has none
    for handler in handlers:
        if (isinstance(handler, logging.StreamHandler) and _isatty(handler.stream)
                and not getattr(handler, "_ends_bar_line", False)):
            handler.emit = _emitting_apart(handler.emit)  # type: ignore[method-assign,assignment]
            handler._ends_bar_line = True  # type: ignore[attr-defined]


def _emitting_apart(emit: Callable[[logging.LogRecord], None]) -> Callable[[logging.LogRecord], None]:
    def emit_apart(record: logging.LogRecord) -> None:
        # one lock, uncontended but while a bar draws: no bar can draw between the line end and
        # the record (end_line's check alone would let one slip in from the loading thread)
        with _lock:
            end_line()
            emit(record)
    return emit_apart


def _apart(stream: TextIO) -> TextIO:
    """``stream`` ending a bar's line before each write, when it is a terminal; itself otherwise."""
    if isinstance(stream, _LineApart) or not _isatty(stream):
        return stream
    return cast(TextIO, _LineApart(stream))


class _LineApart:
    """A terminal's stream (``sys.stderr``, ``sys.stdout``) that ends the line of a bar drawn on
    the terminal before any text written to it; all else is the stream's own. A bar draws on the
    stream underneath (``ProgressBar`` unwraps it), so its redraws stay on its line."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        with _lock:  # no bar draws between the line end and the text (as for a log record)
            if text:
                end_line()
            return self.stream.write(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # fileno, flush, isatty, encoding, buffer...
        if name == "stream":  # not set yet (a copy being made): no endless lookup
            raise AttributeError(name)
        return getattr(self.stream, name)


class ProgressBar:
    """Call with (done, total). Redraws in place on a terminal, prints every 25% otherwise.

    Work that ends within ``quiet_for`` seconds shows nothing (a model copied out of its package in
    0.2 s needs no bar); longer work shows the bar from then on, always with its final line.

    The rate, and the time left from it, count from the first call: a bar that starts part way
    (prompts embedded by an earlier run, a resumed download) does not take what was already there
    for speed.

    ``detail`` (set by the caller, e.g. the file of a several-file model being copied) is shown at
    the end of the line. On a terminal the line is cut to its width: a longer one wraps, and each
    redraw then starts a new line instead of drawing over the last.

    ``close()`` (or ``end_line()`` for whichever bar drew last) ends a terminal line left unfinished.
    """

    def __init__(self, label: str, *, unit: str = "MB", scale: float = 1e6,
                 stream: TextIO | None = None, quiet_for: float = 1.0) -> None:
        self.label, self.unit, self.scale = label, unit, scale
        stream = stream or sys.stderr
        # the terminal itself: a bar's own redraws must not end its line (_LineApart)
        self.stream = stream.stream if isinstance(stream, _LineApart) else stream
        self.tty = self.stream.isatty()
        self.start = time.perf_counter()
        self._last_draw = 0.0
        self._last_quarter = -1
        self.quiet_for = quiet_for
        self._shown = False
        self.finished = False
        self._first: tuple[float, int] | None = None  # (time, done) of the first call
        self._width = 0
        self.detail = ""

    def __call__(self, done: int, total: int | None) -> None:
        global _open
        now = time.perf_counter()
        if self._first is None:
            self._first = (now, done)
        final = total is not None and done >= total
        if not self._shown and now - self.start < self.quiet_for:
            self.finished = final
            return
        self._shown = True
        if self.tty:
            if not final and now - self._last_draw < 0.1:
                return
            self._last_draw = now
            # redrawn in place: pad over the end of a longer line drawn before
            cols = self._columns()
            line = self._line(done, total, now)[:cols]
            self._width = min(max(self._width, len(line)), cols)
            with _lock:  # not between a log record's line end and the record (log_lines_apart)
                self.stream.write("\r" + line.ljust(self._width))
                if final:
                    self.stream.write("\n")
                    _open = None
                else:
                    _open = self
                self.finished = final
                self.stream.flush()
            return
        quarter = int(100 * done / total) // 25 if total else 0
        if quarter == self._last_quarter and not final:
            return
        self._last_quarter = quarter
        self.stream.write(self._line(done, total, now) + "\n")
        self.finished = final
        self.stream.flush()

    def close(self) -> None:
        """End the bar's terminal line if it was drawn and not finished; otherwise nothing."""
        global _open
        with _lock:
            if _open is not self:
                return
            _open = None
            try:
                self.stream.write("\n")
                self.stream.flush()
            except (OSError, ValueError):  # a terminal gone, a closed stream: nothing left to end
                pass

    def _columns(self) -> int:
        """The longest line that fits the terminal: its width less one (a line that fills the
        last column wraps on some terminals). COLUMNS first, as ``shutil.get_terminal_size``."""
        try:
            cols = int(os.environ.get("COLUMNS", "0"))
        except ValueError:
            cols = 0
        if cols <= 0:
            try:
                cols = os.get_terminal_size(self.stream.fileno()).columns
            except (AttributeError, OSError, ValueError):  # not a real terminal (a test's stream)
                cols = 0
        return max(cols, 20) - 1 if cols > 0 else 10**6

    def for_steps(self, suffix: str) -> ProgressBar:
        """A bar on the same stream for work counted in percent (a build's steps, not bytes),
        labelled ``self.label + suffix``: a caller's download bar handed to a build."""
        return ProgressBar(self.label + suffix, unit="%", scale=1, stream=self.stream,
                           quiet_for=self.quiet_for)

    def _line(self, done: int, total: int | None, now: float) -> str:
        line = self._bar_line(done, total, now)
        return f"{line}  ({self.detail})" if self.detail else line

    def _bar_line(self, done: int, total: int | None, now: float) -> str:
        t0, d0 = self._first or (self.start, 0)
        # rate = (done - done at the first call) / (time since then); left = (total - done) / rate
        rate = (done - d0) / max(now - t0, 1e-6)
        left = f", {duration((total - done) / rate)} left" if total and 0 < rate and done < total else ""
        if total and self.unit == "%":  # steps: the share done and the time so far, no amounts
            frac = min(done / total, 1.0)
            return f"{self.label} [{'#' * int(frac * 30):<30}] {frac:4.0%} {now - self.start:.0f} s{left}"
        digits = 0 if self.scale == 1 else 1  # counted things (prompts) are whole
        speed = f"{rate / self.scale:.0f} {self.unit}/s"
        if total:
            frac = min(done / total, 1.0)
            bar = "#" * int(frac * 30)
            return (f"{self.label} [{bar:<30}] {frac:4.0%} {done / self.scale:.{digits}f}/"
                    f"{total / self.scale:.{digits}f} {self.unit} {speed}{left}")
        return f"{self.label} {done / self.scale:.{digits}f} {self.unit} {speed}"

