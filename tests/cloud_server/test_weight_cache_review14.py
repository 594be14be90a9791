"""The weight cache against odd files and names: a damaged file never stops a load, and writing one
model's file never removes another model's (a GGUF of the same name elsewhere, a name with ``[``)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from cloud_server.models.weight_cache import WeightCache

CPU = torch.device("cpu")


def _cache(gguf: Path, root: Path) -> WeightCache:
    cache = WeightCache.for_model(gguf, device=CPU, dtype=torch.bfloat16, quantization="int8",
                                  enabled=True, root=root)
    assert cache is not None
    return cache


def _weights() -> dict:
    return {"w": (torch.ones(2, 32, dtype=torch.int8), torch.ones(2, 1, 2, dtype=torch.float16)),
            "norm": torch.ones(4)}


def _gguf(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF" + bytes(60))  # only its path, size and mtime are read
    return path


def test_two_ggufs_of_the_same_name_in_two_folders_keep_their_own_files(tmp_path):
    root = tmp_path / "engine-weights"
    a = _cache(_gguf(tmp_path / "qwen-0.5b" / "model.gguf"), root)
    b = _cache(_gguf(tmp_path / "qwen-1.5b" / "model.gguf"), root)
    a.write(_weights())
    b.write(_weights())  # before: removed a's file (same name, "an older key"): converted each start
    assert a.file.is_file() and b.file.is_file()
    assert a.read() is not None and b.read() is not None


def test_an_edited_gguf_whose_name_has_brackets_leaves_no_stale_file(tmp_path):
    root = tmp_path / "engine-weights"
    gguf = _gguf(tmp_path / "my model [v2].gguf")
    old = _cache(gguf, root)
    old.write(_weights())
    st = gguf.stat()
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # replaced: a new key
    new = _cache(gguf, root)
    assert new.file != old.file
    new.write(_weights())
    # before: "[v2]" was read as a glob character class, so the stale file stayed (a model's size)
    assert sorted(p.name for p in root.glob("*.safetensors")) == [new.file.name]


def test_a_damaged_file_in_a_read_only_cache_is_skipped_not_fatal(tmp_path, monkeypatch):
    cache = _cache(_gguf(tmp_path / "m.gguf"), tmp_path / "engine-weights")
    cache.file.parent.mkdir()
    cache.file.write_bytes(b"\x08" + bytes(7) + b"{broken!")
    real_unlink = Path.unlink

    def read_only(self, missing_ok=False):
        if self == cache.file:
            raise PermissionError(13, "Read-only file system", str(self))
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", read_only)
    assert cache.read() is None  # before: PermissionError out of load_model


def test_a_file_missing_a_matrix_scale_is_converted_again(tmp_path):
    from safetensors.torch import save_file

    from cloud_server.models.weight_cache import FORMAT

    cache = _cache(_gguf(tmp_path / "m.gguf"), tmp_path / "engine-weights")
    cache.file.parent.mkdir()
    save_file({"w#int8": torch.ones(2, 32, dtype=torch.int8)}, str(cache.file),
              metadata={"format": FORMAT, "key": cache.key})
    assert cache.read() is None  # before: KeyError 'w#scale' out of load_model
    assert not cache.file.exists()


def test_the_file_of_a_gguf_that_was_moved_away_is_still_removed(tmp_path):
    root = tmp_path / "engine-weights"
    gone = _gguf(tmp_path / "old" / "model.gguf")
    _cache(gone, root).write(_weights())
    gone.unlink()  # moved or deleted: its file is of no use to anyone
    here = _cache(_gguf(tmp_path / "new" / "model.gguf"), root)
    here.write(_weights())
    assert sorted(p.name for p in root.glob("*.safetensors")) == [here.file.name]
