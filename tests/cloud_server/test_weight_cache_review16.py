"""The weight cache's file reaches the disk before its name does: written, fsynced, then renamed
into place (and the folder fsynced). Before, nothing was flushed: a power cut soon after a start
could leave the named file with its header but zeros for data, read back at every later start as
a model of zero weights (a file of the right size and header reads as valid)."""

from __future__ import annotations

import os

import pytest
import torch

from cloud_server.models.weight_cache import WeightCache

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc/self/fd")


def test_the_file_is_flushed_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    cache = WeightCache.for_model(gguf, device=torch.device("cpu"), dtype=torch.bfloat16,
                                  quantization="int8", enabled=True, root=tmp_path / "cache")
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    cache.write({"w": (torch.ones(2, 32, dtype=torch.int8), torch.ones(2, 1, 2, dtype=torch.float16)),
                 "norm": torch.ones(4)})
    assert cache.file.is_file()
    tmp = next(src for kind, src in events if kind == "replace")
    at = events.index(("replace", tmp))
    assert ("fsync", tmp) in events[:at]  # the data, before the name
    assert ("fsync", str(cache.file.parent)) in events[at:]  # the rename itself
    assert cache.read() is not None
