"""One exclusive lock between processes, the primitive every lock of this package is built on.

``fcntl.flock`` on an open file or folder: released when the descriptor is closed, so a process
that dies holds nothing. Where files cannot be locked (Windows has no ``fcntl``; some network
mounts answer ENOLCK, EOPNOTSUPP or ENOSYS; NFS, which emulates flock with a write lock, answers
EBADF for a descriptor not open for writing, as a folder never is) no lock is held and the caller
goes on without one, as the callers always did there, rather than failing.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

HAVE_LOCKS = fcntl is not None  # False on Windows: os.open cannot open a folder there either

# the errors of a file system that has no locks, as opposed to a real failure; ENOSYS: Lustre
# mounted without its flock option (HPC home folders) answers "Function not implemented"
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS})


def lock_exclusive(fd: int, on_wait: Callable[[], None] | None = None) -> bool:
    """Wait for an exclusive lock on the open ``fd``; whether one is held (False: no locks here).

    ``on_wait`` is called once, before waiting, when another process holds the lock.
    """
    if fcntl is None:  # pragma: no cover - Windows
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    except OSError as exc:
        if exc.errno in _NO_LOCKS or (exc.errno == errno.EBADF and _is_open(fd)):
            return False
        raise


def _is_open(fd: int) -> bool:
    """Whether ``fd`` is an open descriptor: EBADF on one is NFS refusing an exclusive lock on a
    descriptor opened read-only (a folder, the models' lock); on any other, a real error."""
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
