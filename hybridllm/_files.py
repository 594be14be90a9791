"""What a killed build leaves behind: one sweep for every preparer that writes under a temporary
name and holds a folder lock from the temporary's creation to its rename or removal."""

from __future__ import annotations

import contextlib
import re
import shutil
from pathlib import Path


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
