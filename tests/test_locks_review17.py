"""The process lock on file systems that have none, and on real ones (review 17).

Lustre mounted without its flock option (a common HPC home folder) answers flock with ENOSYS
("Function not implemented"): a pull failed there with "Cannot copy ... (Function not
implemented)", where the other lock-less mounts (ENOLCK, EOPNOTSUPP) go on without a lock.
"""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

from hybridllm import _locks
from hybridllm._locks import lock_exclusive


def _flock_failing(code, *, after_wait=False):
    class Fcntl:
        LOCK_EX, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB

        @staticmethod
        def flock(fd, op):
            if after_wait and op & fcntl.LOCK_NB:
                raise BlockingIOError(errno.EWOULDBLOCK, "held")
            raise OSError(code, os.strerror(code))

    return Fcntl


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP])
def test_a_file_system_without_locks_goes_on_without_one(tmp_path, monkeypatch, code):
    monkeypatch.setattr(_locks, "fcntl", _flock_failing(code))
    with open(tmp_path / "lock", "w") as fh:
        assert lock_exclusive(fh.fileno()) is False


def test_no_locks_found_while_waiting_goes_on_too_and_says_it_waited_once(tmp_path, monkeypatch):
    monkeypatch.setattr(_locks, "fcntl", _flock_failing(errno.ENOSYS, after_wait=True))
    waited = []
    with open(tmp_path / "lock", "w") as fh:
        assert lock_exclusive(fh.fileno(), lambda: waited.append(1)) is False
    assert waited == [1]


def test_a_real_failure_is_not_taken_for_a_file_system_without_locks(monkeypatch):
    monkeypatch.setattr(_locks, "fcntl", _flock_failing(errno.EBADF))
    with pytest.raises(OSError) as err:
        lock_exclusive(12345)
    assert err.value.errno == errno.EBADF


def test_a_read_only_folder_is_locked_exclusively(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    fd = os.open(folder, os.O_RDONLY)
    other = os.open(folder, os.O_RDONLY)  # another open of it (what another process holds)
    try:
        assert lock_exclusive(fd) is True
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)  # closing releases it
        fd = -1
        assert lock_exclusive(other) is True
    finally:
        for f in (fd, other):
            if f >= 0:
                os.close(f)
        folder.chmod(0o755)
