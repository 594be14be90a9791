"""Measure and remove what hybridllm materialized for one catalog model (`hybridllm models remove`).

What belongs to a model id, all under the data dir:

- ``models/<id>/``: the pulled files and their ``.verified`` markers, the prepared ONNX folders of
  every precision (``onnx-<precision>-cpu/``), a failed build's log, and the temporary files and
  folders of a pull or a build that was killed;
- for the cache's embedder (``minilm-l6-v2``): ``embedders/<id>/`` and every ``rerankers/<id>-<digest>/``,
  the ONNX exports built from its weights (the cache builds them again on its next use);
- the cloud engine's int8 / int4 conversions of its GGUF, ``engine-weights/*.safetensors`` whose
  header names a source inside ``models/<id>/`` (a cloud server converts it again on its next start).

Nothing is shared between models, so removing one never touches another's files. Links are never
followed: a link among these paths is unlinked, and a path whose folder resolves outside the data
dir is refused. The model folder's lock (the one pull and prepare take) is held while it goes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .._exceptions import ModelError, ModelNotFoundError
from .._locks import HAVE_LOCKS, lock_exclusive  # without locks (Windows) removed without one
from .._paths import data_dir
from .catalog import ModelSpec, did_you_mean, find_spec, load_catalog
from .engine_weights import converted_from
from .store import _folder_lock, model_dir

_CACHE_LOCK = ".prepare.lock"  # the cache's preparers lock this file in their folder


@dataclass(frozen=True)
class Entry:
    """One path that `remove` deletes, and the bytes that frees (a symbolic link, or a file linked
    to its package's, counts as 0: the data stays under the other name)."""

    path: Path
    bytes: int


class RemoveIncompleteError(ModelError):
    """Some of a model's paths could not be deleted (permission denied, a busy file)."""

    def __init__(self, message: str, removed: list[Path], failed: list[tuple[Path, str]], freed: int):
        super().__init__(message)
        self.removed = removed
        self.failed = failed
        self.freed = freed


def _cache_exports(spec: ModelSpec) -> list[Path]:
    """The cache's exported folders built from this model's weights (only the embedder has any)."""
    if spec.kind != "embedding":
        return []
    root = data_dir()
    found = [root / "embedders" / spec.id]
    rerankers = root / "rerankers"
    pattern = re.compile(rf"{re.escape(spec.id)}-[0-9a-f]+")  # cache/prepare.py: reranker_dir()
    with contextlib.suppress(OSError):
        found += sorted(p for p in rerankers.iterdir() if pattern.fullmatch(p.name))
    return found


def _exists(path: Path) -> bool:
    return os.path.lexists(path)


def _size(path: Path, seen: set[tuple[int, int]] | None = None, *, shared: bool = False) -> int:
    """Bytes that deleting ``path`` frees: its regular files at or under it, links not followed,
    hard links once. A file with another name too (a pulled model linked to its package's file)
    frees nothing while that name stays: not counted, unless ``shared``, which counts only those."""
    seen = set() if seen is None else seen
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    if stat.S_ISDIR(st.st_mode):
        total = 0
        with contextlib.suppress(OSError), os.scandir(path) as it:
            for entry in it:
                total += _size(Path(entry.path), seen, shared=shared)
        return total
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in seen or (st.st_nlink > 1) != shared:
        return 0
    seen.add((st.st_dev, st.st_ino))
    return st.st_size


def _inside(path: Path, root: Path) -> bool:
    """``path``'s folder resolves inside ``root`` (``path`` itself may be a link: it is unlinked)."""
    parent = Path(os.path.realpath(path.parent))
    return parent.is_relative_to(Path(os.path.realpath(root))) and path.name not in ("", ".", "..")


def spec_of(model_id: str) -> ModelSpec:
    """The catalog entry, or an error naming the known ids (a local file is not ours to delete)."""
    spec = find_spec(model_id)  # case and spaces around the id aside, as everywhere else
    if spec is None:
        raise ModelNotFoundError(
            f"Unknown model {model_id!r}{_local(model_id)}. Known models: "
            f"{', '.join(sorted(load_catalog()))}. See `hybridllm models list`.{did_you_mean(model_id)}"
        )
    return spec


def _local(text: str) -> str:
    """`` (a local folder, ...)`` when ``text`` names a path that is there: `models verify ~/llama/`
    was told only that the catalog lacks it, as if misspelt; a local model has no catalog sha256
    to verify it against, nor files of hybridllm's to pull or remove."""
    try:
        path = Path(text).expanduser()
        if not text.strip() or not os.path.lexists(path):
            return ""
        kind = "folder" if path.is_dir() else "file"
    except (OSError, RuntimeError, ValueError):  # ~nosuchuser, a NUL in the name
        return ""
    return (f" (a local {kind}, not a catalog id; a local model is used by its path, "
            "with no catalog sha256 to verify it against)")


def _tops(model_id: str) -> list[Path]:
    spec = spec_of(model_id)
    if not spec.id or spec.id in (".", "..") or "/" in spec.id or os.sep in spec.id:
        raise ModelError(f"Catalog id {spec.id!r} is not a plain name; refusing to remove it.")
    folder = model_dir(spec)
    return [p for p in (folder, *_cache_exports(spec), *converted_from(folder)) if _exists(p)]


def plan(model_id: str) -> list[Entry]:
    """What :func:`remove` would delete, with sizes: the model folder's entries (a pulled file's
    hidden ``.verified`` marker counted with it) and the cache's exported folders. Empty when
    nothing of the model is on disk."""
    folder = model_dir(spec_of(model_id))
    entries = []
    for top in _tops(model_id):
        children: list[Path] = []
        if top == folder and not top.is_symlink() and top.is_dir():
            with contextlib.suppress(OSError):
                children = sorted(p for p in top.iterdir() if not _is_marker(p))
        if not children:  # a link, a cache folder, or a model folder with nothing but markers
            entries.append(Entry(top, _size(top)))
        for child in children:
            entries.append(Entry(child, _size(child) + _size(child.with_name(f".{child.name}.verified"))))
    return entries


def _is_marker(path: Path) -> bool:
    return path.name.startswith(".") and path.name.endswith(".verified")


def disk_usage(model_id: str) -> int:
    """Bytes on disk of everything hybridllm materialized for ``model_id`` (0 when nothing), as
    removing it would free them: a file linked to its package's is in :func:`linked_usage`."""
    seen: set[tuple[int, int]] = set()
    return sum(_size(top, seen) for top in _tops(model_id))


def linked_usage(model_id: str) -> int:
    """Bytes of ``model_id``'s files that have another name too (hard links to their package's
    files, see ``store``): no space beyond the package's, and not freed by removing the model."""
    seen: set[tuple[int, int]] = set()
    return sum(_size(top, seen, shared=True) for top in _tops(model_id))


@contextlib.contextmanager
def _cache_lock(folder: Path) -> Iterator[None]:
    """The lock a cache preparer holds on ``folder`` (its lock file; none is created here)."""
    fd = -1
    if HAVE_LOCKS and not folder.is_symlink():
        with contextlib.suppress(OSError):
            fd = os.open(folder / _CACHE_LOCK, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        if fd >= 0:
            with contextlib.suppress(OSError):
                lock_exclusive(fd)
        yield
    finally:
        if fd >= 0:
            os.close(fd)


def _delete(path: Path, failed: list[tuple[Path, str]]) -> None:
    """Delete one path without following links: a link or file is unlinked, a folder's tree removed."""

    def note(_func: Callable[..., object], where: str, exc_info: tuple[type, BaseException, object]) -> None:
        exc = exc_info[1]
        if isinstance(exc, FileNotFoundError):  # gone already: nothing to report
            return
        if getattr(exc, "errno", None) == errno.ENOTEMPTY and failed:  # because of a child above
            return
        failed.append((Path(where), getattr(exc, "strerror", None) or str(exc)))

    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink()
        else:
            shutil.rmtree(path, onerror=note)  # never follows links (on Linux it works through fds)
    except FileNotFoundError:
        pass
    except OSError as exc:
        failed.append((path, exc.strerror or str(exc)))


def remove(model_id: str, *, on_wait: Callable[[], None] | None = None) -> list[Path]:
    """Delete everything hybridllm materialized for ``model_id``; return the paths deleted (those
    :func:`plan` lists).

    The pulled files, every prepared ONNX folder, temporary leftovers and, for the cache's embedder,
    its exported folders (see the module docstring). An id with nothing on disk returns []. A
    deletion that fails part way raises :class:`RemoveIncompleteError`, which lists what was and was
    not removed. ``on_wait`` is called when a pull or prepare of this model holds its folder.
    """
    folder = model_dir(spec_of(model_id))
    root = data_dir()
    planned = [e.path for e in plan(model_id)]
    before = disk_usage(model_id)
    failed: list[tuple[Path, str]] = []
    for top in _tops(model_id):
        if not _inside(top, root):
            failed.append((top, f"its folder resolves outside the data dir {root}; remove it by hand"))
            continue
        if top.is_symlink() or not top.is_dir():
            _delete(top, failed)  # a link is unlinked, never followed
            continue
        lock = _folder_lock(top, on_wait=on_wait) if top == folder else _cache_lock(top)
        with lock:
            _delete(top, failed)
    removed = [p for p in planned if not _exists(p)]
    freed = before - disk_usage(model_id)
    if failed:
        gone = ", ".join(str(p) for p in removed) or "nothing"
        lines = "; ".join(f"{p} ({why})" for p, why in failed[:5])
        more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
        raise RemoveIncompleteError(
            f"Could not remove all of {model_id}: {lines}{more}. Removed: {gone} ({human_size(freed)} "
            f"freed). Fix the cause and run `hybridllm models remove {model_id} --yes` again.",
            removed, failed, freed,
        )
    return removed


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def human_size(n: int) -> str:
    """Bytes as a person reads them: ``412.3 MB``, ``1.12 GB``, ``0 B``."""
    if n == 0:
        return "0 B"
    if n < 100_000:
        return f"{n / 1e3:.1f} kB"
    return _mb(n)


__all__ = ["Entry", "RemoveIncompleteError", "disk_usage", "human_size", "plan", "remove", "spec_of"]
