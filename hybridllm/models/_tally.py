"""One progress for all the files of a model being pulled (``store.pull``)."""

from __future__ import annotations

from collections.abc import Callable

from .._exceptions import ModelError
from .._progress import ProgressBar
from ._sources import _source_parts
from .catalog import FileSpec, ModelSpec

Progress = Callable[[int, int | None], None]  # (bytes done, bytes total or None)


class _Tally:
    """One progress for all the files of a model (before: the bar restarted at 0 for each of the
    9 files of minilm-l6-v2, with no time left for the whole): file k's ``(done, _)`` is reported
    as ``(bytes of the files finished before it + done, bytes of all the files to do)``, and a
    :class:`ProgressBar` shows the current file's name when there are several.

    The total is the catalog's sizes (the package's files for one without a size); when it cannot
    be known up front (a package missing), each file reports its own bytes, as before.
    """

    def __init__(self, spec: ModelSpec, files: list[FileSpec], progress: Progress | None) -> None:
        self.progress, self.base, self.current = progress, 0, 0
        self.bar = progress if len(files) > 1 and isinstance(progress, ProgressBar) else None
        try:
            self.total: int | None = sum(
                f.size if f.size is not None else sum(p.stat().st_size for p in _source_parts(spec, f))
                for f in (files if progress else ()))
        except (ModelError, OSError):
            self.total = None

    def file(self, file: FileSpec | None) -> Progress | None:
        """The progress for one file's bytes (``None`` for a file outside the total: none);
        :meth:`commit` once the file is in place."""
        self.current = 0
        progress, total = self.progress, self.total
        if progress is None or total is None or file is None:
            return progress if file is not None else None
        if self.bar is not None:
            self.bar.detail = file.name

        def report(done: int, _total: int | None) -> None:
            self.current = done
            progress(self.base + done, total)
        return report

    def commit(self, size: int | None = None) -> None:
        """The file is done (kept, copied, or ``size`` bytes another pull put in place)."""
        self.base += self.current if size is None else size
        self.current = 0
        if size is not None and self.progress is not None and self.total is not None:
            self.progress(self.base, self.total)
