"""hybridllm._files.remove_leftovers: the one sweep of a killed build's temporaries, used by the
cache preparer (.NAME.PID.tmp files) and the ONNX build (.onnx-*-cpu.PID.tmp/.old folders)."""

from __future__ import annotations

import re

from hybridllm._files import remove_leftovers
from hybridllm.cache import prepare
from hybridllm.models import onnx_prepare


def test_files_and_folders_whose_whole_name_matches_are_removed_and_nothing_else(tmp_path):
    (tmp_path / ".a.1.tmp").write_bytes(b"x")
    (tmp_path / ".b.2.tmp" / "inner").mkdir(parents=True)
    (tmp_path / ".b.2.tmp" / "inner" / "w").write_bytes(b"w")
    (tmp_path / ".a.1.tmp.keep").write_text("x")  # matches only in part
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "mine").write_text("mine")
    (tmp_path / ".c.3.tmp").symlink_to(tmp_path / "target")  # the link goes, never what it points at
    remove_leftovers(tmp_path, re.compile(r"\.\w\.\d+\.tmp"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".a.1.tmp.keep", "target"]
    assert (tmp_path / "target" / "mine").read_text() == "mine"


def test_the_cache_preparer_sweeps_what_its_glob_swept(tmp_path):
    names = [f".{n}.{pid}.tmp" for n in prepare._NAMES for pid in ("123", "x.y", "")]
    others = [".model.onnx.123.tmpx", "model.onnx.123.tmp", f".{prepare.LOGIT_RANGE_NAME}.123.tmp",
              ".prepare.lock", "model.onnx", ".model.onnx.tmp"]
    for name in names + others:
        (tmp_path / name).write_text("x")
    globbed = {p.name for n in prepare._NAMES for p in tmp_path.glob(f".{n}.*.tmp")}
    assert globbed == set(names)
    remove_leftovers(tmp_path, prepare._LEFTOVER)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)


def test_the_onnx_build_sweeps_work_and_swap_folders_only(tmp_path):
    for name in (".onnx-int4-cpu.12.tmp", ".onnx-fp32-cpu.34.old"):
        (tmp_path / name / "hf").mkdir(parents=True)
    for name in (".onnx-int4-cpu.x.tmp", "onnx-int4-cpu", "onnx-int4-cpu.build.log"):
        (tmp_path / name).mkdir()
    remove_leftovers(tmp_path, onnx_prepare._STALE_BUILD)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".onnx-int4-cpu.x.tmp", "onnx-int4-cpu",
                                                          "onnx-int4-cpu.build.log"]
