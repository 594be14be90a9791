"""The process lock on an NFS home folder (review 19).

Linux's NFS client emulates flock with a POSIX write lock, which needs a descriptor open for
writing: an exclusive flock on one opened read-only (a folder, as `models pull` and `models remove`
lock) answers EBADF. That was taken for a real failure, so a pull into an NFS HYBRIDLLM_HOME failed
outright, where the other lock-less mounts go on without a lock.
"""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

from hybridllm import _locks
from hybridllm._locks import lock_exclusive
from hybridllm.models import store


class _NfsFcntl:
    """flock as Linux's NFS client answers it for a descriptor opened read-only."""

    LOCK_EX, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB

    @staticmethod
    def flock(fd, op):
        os.fstat(fd)  # a closed descriptor is EBADF here too, as the real call says
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))


def test_ebadf_on_an_open_read_only_folder_goes_on_without_a_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(_locks, "fcntl", _NfsFcntl)
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        assert lock_exclusive(fd) is False
    finally:
        os.close(fd)


def test_ebadf_on_a_closed_descriptor_is_still_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(_locks, "fcntl", _NfsFcntl)
    fd = os.open(tmp_path, os.O_RDONLY)
    os.close(fd)
    with pytest.raises(OSError) as err:
        lock_exclusive(fd)
    assert err.value.errno == errno.EBADF


def test_the_models_folder_lock_on_nfs_yields_no_lock_rather_than_failing(tmp_path, monkeypatch):
    monkeypatch.setattr(_locks, "fcntl", _NfsFcntl)
    folder = tmp_path / "models" / "m"
    folder.mkdir(parents=True)
    with store._folder_lock(folder) as locked:
        assert locked is False
