"""Files written whole or not at all (:func:`atomic_write`, :func:`replacing`), and what a killed
build leaves behind: one sweep for every preparer that writes under a temporary name and holds a
folder lock from the temporary's creation to its rename or removal."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

# What reading a damaged .npz (np.load) raises, every one the file's fault: a truncated or half-copied
# archive (BadZipFile, EOFError, zlib's error), a member missing or of another shape (KeyError,
# ValueError, TypeError), and a flipped byte in a zip header naming a compression method, version or
# flag zipfile does not implement (NotImplementedError, which came out as an internal error)
DAMAGED_NPZ_ERRORS = (OSError, ValueError, TypeError, KeyError, EOFError, zipfile.BadZipFile, zlib.error,
                      NotImplementedError)


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A new, empty temporary file beside ``path``, for a writer that takes a file name (a
    compiler's ``-o``, ``onnx.save``); renamed onto ``path`` when the block ends without an error.

    The name is ``.{path.name}.{random}.{pid}.tmp``: the same folder (a rename never crosses file
    systems), unique to this writer (threads and processes never share one), and one the leftover
    sweeps of the folders written this way recognise (``.NAME.*.tmp``, a pid last). The file's data
    reaches the disk (``fsync``) before its name does, and the rename itself after (the folder is
    fsynced, where the system can: not on Windows), so a power cut never leaves a named file of
    zeros. On any error, ``KeyboardInterrupt`` included, the temporary is removed, ``path`` is left
    as it was, and the error is raised. Made with the umask's permissions, as ``open`` makes a file.
    """
    while True:
        tmp = temporary_name(path)
        try:  # O_EXCL: never another writer's file, nor a leftover of a process of the same pid
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:  # pragma: no cover - 1 in 4 billion
            continue
    with renamed_into_place(tmp, path):
        yield tmp
        fsync_file(tmp)


def temporary_name(path: Path) -> Path:
    """``.{path.name}.{random}.{pid}.tmp`` beside ``path`` (see :func:`replacing`)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.{os.getpid()}.tmp")


@contextlib.contextmanager
def renamed_into_place(tmp: Path, path: Path) -> Iterator[None]:
    """Rename the whole file ``tmp`` onto ``path`` when the block ends without an error, then
    fsync the folder; on any error (``KeyboardInterrupt`` too) remove ``tmp`` and raise."""
    try:
        yield
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)



@contextlib.contextmanager
def atomic_write(path: Path, mode: str = "wb", *, encoding: str | None = None) -> Iterator[IO[Any]]:
    """The open temporary file of :func:`replacing` (``mode``: "wb" or "w"), to write ``path``."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_write writes a whole file: mode 'w' or 'wb', not {mode!r}")
    with replacing(path) as tmp, open(tmp, mode, encoding=encoding) as fh:
        yield fh


def fsync_file(path: Path) -> None:
    """Flush a written file's data to the disk (opened for writing: Windows flushes no other)."""
    fd = os.open(path, os.O_RDWR | getattr(os, "O_BINARY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename) to the disk, where the system can (not on Windows)."""
    if os.name == "nt":  # a folder cannot be opened there
        return
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_leftovers(folder: Path, name: re.Pattern[str]) -> None:
    """Remove every entry of ``folder`` whose whole name matches ``name``, file or folder: the
    temporaries of builds that were killed (SIGKILL, the OOM killer: no ``finally`` ran). Only to
    be called with the lock each such build holds, so that none is a live build's. One that cannot
    be removed is left for the next sweep."""
    for path in folder.iterdir():
        if not name.fullmatch(path.name):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
