"""hybridllm._files.atomic_write / replacing: the one write-temporary-then-rename of the project
(refused-fields memory, cache preparer, model store, engine CPU kernels; the weight cache shares
its fsyncs). A file appears whole or not at all: data fsynced before the rename, the folder after,
and on any error (Ctrl-C too) the old file is left as it was and no temporary stays behind.

Before, the refused-fields memory and the cache preparer's logit ranges left their temporary on a
KeyboardInterrupt (they cleaned up on OSError only), and the preparer left its four temporaries
(up to ~120 MB) on a Ctrl-C while building, or on a failed rename, until its next run."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
import threading
from pathlib import Path

import pytest

from hybridllm import _files
from hybridllm._files import atomic_write, replacing
from hybridllm.backends.refusals import FILE_NAME, RefusalMemory
from hybridllm.cache import prepare
from hybridllm.models import store


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def _interrupting_replace(monkeypatch):
    def replace(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", replace)


# --- the helper ---------------------------------------------------------------------------------


def test_writes_the_whole_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("old")
    with atomic_write(path, "w", encoding="utf-8") as fh:
        fh.write("néw")
        assert path.read_text() == "old"  # nothing seen before the block ends
    assert path.read_text(encoding="utf-8") == "néw"
    assert _temporaries(tmp_path) == []


@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError, ValueError])
def test_an_error_mid_write_keeps_the_old_file_and_removes_the_temporary(tmp_path, error):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    with pytest.raises(error), atomic_write(path) as fh:
        fh.write(b"half a ")
        fh.flush()
        raise error
    assert path.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [path]


def test_a_failed_fsync_is_raised_and_nothing_is_renamed(tmp_path, monkeypatch):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")

    def full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"), atomic_write(path) as fh:
        fh.write(b"new")
    assert path.read_bytes() == b"old" and list(tmp_path.iterdir()) == [path]


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/fd")
def test_the_data_is_fsynced_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
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
    with atomic_write(tmp_path / "f.bin") as fh:
        fh.write(b"x")
    ((_, tmp),) = [e for e in events if e[0] == "replace"]
    assert events == [("fsync", tmp), ("replace", tmp), ("fsync", str(tmp_path))]


def test_a_file_written_by_name_is_renamed_into_place(tmp_path):
    with replacing(tmp_path / "lib.so") as tmp:
        assert tmp.parent == tmp_path and tmp.exists()
        tmp.write_bytes(b"\x7fELF")  # as a compiler's -o writes it
    assert (tmp_path / "lib.so").read_bytes() == b"\x7fELF" and _temporaries(tmp_path) == []


def test_temporaries_are_unique_and_the_folders_sweeps_recognise_them(tmp_path):
    from cloud_server.models import weight_cache  # noqa: PLC0415 - needs torch

    dest = tmp_path / prepare.INT8_NAME
    with replacing(dest) as a, replacing(dest) as b:  # two writers of one file, one process
        assert a != b
        for tmp in (a, b):
            assert prepare._LEFTOVER.fullmatch(tmp.name)
            assert re.fullmatch(rf"{re.escape(store._tmp_prefix(dest))}.*\.tmp", tmp.name, re.DOTALL)
            match = weight_cache._PARTIAL.match(tmp.name)
            assert match and int(match[1]) == os.getpid()
    assert _temporaries(tmp_path) == []


def test_a_new_file_gets_the_umasks_permissions_as_open_gives(tmp_path):
    with atomic_write(tmp_path / "f") as fh:
        fh.write(b"x")
    (tmp_path / "g").write_bytes(b"x")
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == stat.S_IMODE((tmp_path / "g").stat().st_mode)


def test_only_whole_file_modes(tmp_path):
    with pytest.raises(ValueError, match="whole file"), atomic_write(tmp_path / "f", "ab"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_the_folder_fsync_is_skipped_on_windows(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "name", "nt")
    monkeypatch.setattr(os, "open", lambda *a, **k: pytest.fail("a folder opened on Windows"))
    _files.fsync_folder(tmp_path)


# --- its users ----------------------------------------------------------------------------------


def test_refusal_memory_interrupted_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / FILE_NAME
    memory = RefusalMemory(path)
    memory.remember("https://api.example/v1", "o1", frozenset({"stop"}))
    before = path.read_bytes()
    _interrupting_replace(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        memory.remember("https://api.example/v1", "o3", frozenset({"top_k"}))
    assert path.read_bytes() == before
    assert _temporaries(tmp_path) == []


def test_logit_ranges_interrupted_keep_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    from hybridllm.cache import logit_bound

    (tmp_path / prepare.FP32_NAME).write_bytes(b"graph")
    path = tmp_path / prepare.LOGIT_RANGE_NAME
    path.write_text("damaged")  # read again off the graphs, and written
    monkeypatch.setattr(logit_bound, "logit_range", lambda _p: (-3.0, 4.0))
    _interrupting_replace(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        prepare.logit_ranges(tmp_path)
    assert path.read_text() == "damaged"
    assert _temporaries(tmp_path) == []
    monkeypatch.undo()
    monkeypatch.setattr(logit_bound, "logit_range", lambda _p: (-3.0, 4.0))
    assert prepare.logit_ranges(tmp_path) == {prepare.FP32_NAME: (-3.0, 4.0)}
    assert json.loads(path.read_text()) == {prepare.FP32_NAME: [-3.0, 4.0]}
    assert _temporaries(tmp_path) == []


def _fake_build(monkeypatch, tmp_path: Path, *, quantize_error: BaseException | None = None) -> Path:
    import onnx

    source = tmp_path / "source"
    source.mkdir()
    (source / prepare.TOKENIZER_NAME).write_text("new tokenizer")

    def save(model, path):
        Path(path).write_bytes(b"new fp32 " + model)

    def quantize(src, dst):
        Path(dst).write_bytes(b"half an int8 graph")
        if quantize_error is not None:
            raise quantize_error
        Path(dst).write_bytes(b"new int8")

    monkeypatch.setattr(onnx, "save", save)
    monkeypatch.setattr(prepare, "quantize", quantize)
    return source


def _old_folder(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    for name in prepare._NAMES:
        (out / name).write_text(f"old {name}")
    return out


def _old_files_intact(out: Path) -> bool:
    return all((out / n).read_text() == f"old {n}" for n in prepare._NAMES)


def test_the_preparer_interrupted_while_building_keeps_the_old_files_and_no_temporary(tmp_path, monkeypatch):
    source = _fake_build(monkeypatch, tmp_path, quantize_error=KeyboardInterrupt())
    out = _old_folder(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        prepare._write_files(out, lambda _src: b"graph", source)
    assert _old_files_intact(out) and _temporaries(out) == []


def test_the_preparer_failing_to_rename_leaves_no_temporary_and_a_model_error(tmp_path, monkeypatch):
    source = _fake_build(monkeypatch, tmp_path)
    out = _old_folder(tmp_path)
    real_replace = os.replace

    def replace(src, dst):  # the first file renamed, then the disk gives out
        if Path(dst).name != prepare.FP32_NAME:
            raise OSError(errno.EIO, "Input/output error")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(prepare.ModelError, match="Input/output error"):
        prepare._write_files(out, lambda _src: b"graph", source)
    assert _temporaries(out) == []
    # the recipe, renamed last, is still the old one: the folder is not taken for prepared
    assert (out / prepare.RECIPE_NAME).read_text() == f"old {prepare.RECIPE_NAME}"


def test_the_preparer_renames_every_file_with_the_recipe_last(tmp_path, monkeypatch):
    source = _fake_build(monkeypatch, tmp_path)
    out = _old_folder(tmp_path)
    (out / prepare.LOGIT_RANGE_NAME).write_text("{}")
    renamed: list[str] = []
    real_replace = os.replace

    def replace(src, dst):
        renamed.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    prepare._write_files(out, lambda _src: b"graph", source)
    assert renamed == list(prepare._NAMES)
    assert prepare.is_prepared(out) and (out / prepare.INT8_NAME).read_bytes() == b"new int8"
    assert (out / prepare.FP32_NAME).read_bytes() == b"new fp32 graph"
    assert not (out / prepare.LOGIT_RANGE_NAME).exists() and _temporaries(out) == []


def _fake_compiler(tmp_path: Path, body: str) -> str:
    cc = tmp_path / "fake-g++"
    cc.write_text('#!/bin/sh\nwhile [ "$#" -gt 1 ]; do [ "$1" = -o ] && out="$2"; shift; done\n' + body)
    cc.chmod(0o755)
    return str(cc)


@pytest.mark.skipif(os.name == "nt", reason="a shell script as the compiler")
@pytest.mark.parametrize("ok", [True, False])
def test_the_kernel_build_renames_a_whole_library_or_leaves_nothing(tmp_path, monkeypatch, ok):
    pytest.importorskip("torch")
    from cloud_server.layers import cpu_kernels

    body = 'printf "\\177ELF" > "$out"\n' + ("exit 0\n" if ok else 'echo "bad code" >&2; exit 1\n')
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, body))
    lib = tmp_path / "kernels" / "cpu_kernels.abc.so"
    if ok:
        cpu_kernels._build(lib)
        assert lib.read_bytes() == b"\x7fELF"
    else:
        with pytest.raises(RuntimeError, match="bad code"):
            cpu_kernels._build(lib)
        assert not lib.exists()
    assert _temporaries(lib.parent) == []


def test_threads_writing_one_file_never_mix_their_bytes(tmp_path):
    path = tmp_path / "f"
    start = threading.Barrier(4)

    def write(i: int) -> None:
        start.wait()
        for _ in range(5):
            with atomic_write(path) as fh:
                fh.write(bytes([i]) * 10000)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    data = path.read_bytes()
    assert len(data) == 10000 and len(set(data)) == 1
    assert _temporaries(tmp_path) == []
