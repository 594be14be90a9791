"""A progress bar for counted work (prompts embedded) that also says how long is left."""

from __future__ import annotations

import time

from .._progress import ProgressBar


class EtaBar(ProgressBar):
    """:class:`ProgressBar` with the time left, from the rate since the first count it was given:
    a bar over several files starts where the cached ones ended, and their instant counts would
    make the rest look faster than it is. Embedding 60,000 prompts takes about 12 minutes on two
    cores; the rate alone left the sum to the reader."""

    def __init__(self, label: str, *, unit: str = "prompts", **kwargs: object) -> None:
        super().__init__(label, unit=unit, scale=1, **kwargs)  # type: ignore[arg-type]
        self._first: tuple[float, int] | None = None
        self._width = 0

    def __call__(self, done: int, total: int | None) -> None:
        if self._first is None:
            self._first = (time.perf_counter(), done)
        super().__call__(done, total)

    def _line(self, done: int, total: int | None, now: float) -> str:
        t0, d0 = self._first if self._first is not None else (self.start, 0)
        if not total or not (done > d0 and now > t0):
            line = super()._line(done, total, now)
        else:
            rate = (done - d0) / (now - t0)  # the base bar's done / elapsed counts the cached ones
            frac = min(done / total, 1.0)
            line = (
                f"{self.label} [{'#' * int(frac * 30):<30}] {frac:4.0%} {done}/{total} {self.unit} "
                f"{rate:.0f} {self.unit}/s"
            )
            if done < total:
                line += f", {_duration((total - done) / rate)} left"
        # redrawn in place on a terminal: pad over the end of a longer line drawn before
        self._width = max(self._width, len(line))
        return line.ljust(self._width) if self.tty else line


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
