"""A build that was killed (SIGKILL, the OOM killer) leaves its work folder: the next build removes it.

The heavy steps are quick stand-ins (as in tests/test_onnx_prepare_onnxreview.py); the lock, the
sweep and the rename are the real code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the build lock is fcntl's")


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    import cloud_server.models.export_hf as export_hf
    from hybridllm.models import onnx_gguf, onnx_prepare

    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))

    def fake_hf(gguf, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"num_hidden_layers": 1}))
        (out / "tokenizer_config.json").write_text("{}")
        return out

    def fake_builder(cmd, log, num_matmuls, progress, span):
        out = Path(cmd[cmd.index("-o") + 1])
        out.mkdir(parents=True)
        (out / "genai_config.json").write_text("{}")

    monkeypatch.setattr(export_hf, "gguf_to_hf_folder", fake_hf)
    monkeypatch.setattr(onnx_prepare, "_run_builder", fake_builder)
    monkeypatch.setattr(onnx_prepare, "missing_export_modules", lambda: [])
    monkeypatch.setattr(onnx_prepare, "pull", lambda model_id: Path("unused.gguf"))
    monkeypatch.setattr(onnx_gguf, "rewrite", lambda model, gguf: {})
    return tmp_path / "home" / "models" / "smollm2-135m-instruct"


def test_a_killed_builds_work_folders_are_removed_by_the_next_build(fake_build):
    from hybridllm.models import onnx_prepare

    folder = fake_build
    # what a build killed mid-way leaves (its pid is gone; no finally ran): the fp32 export, and a
    # killed swap's old folder; another precision's too (every build holds the same lock)
    stale = [folder / ".onnx-int4-cpu.99999991.tmp", folder / ".onnx-int8-cpu.99999992.tmp",
             folder / ".onnx-int4-cpu.99999993.old"]
    for work in stale:
        (work / "hf").mkdir(parents=True)
        (work / "hf" / "model.safetensors").write_bytes(b"\0" * 4096)
    keep = [folder / "SmolLM2-135M-Instruct.Q4_1.gguf", folder / "onnx-int8-cpu.build.log",
            folder / ".onnx-int4-cpu.notapid.tmp"]  # not a build's name: not ours to remove
    for path in keep:
        path.write_text("x")

    final = onnx_prepare.prepare_onnx("smollm2-135m-instruct")

    assert (final / "genai_config.json").is_file()
    assert [p.name for p in stale if p.exists()] == []
    assert all(p.exists() for p in keep)


def test_a_prepared_folder_is_returned_without_a_sweep_or_a_build(fake_build, monkeypatch):
    from hybridllm.models import onnx_prepare

    first = onnx_prepare.prepare_onnx("smollm2-135m-instruct")
    monkeypatch.setattr(onnx_prepare, "_run_builder", lambda *a: pytest.fail("built again"))
    assert onnx_prepare.prepare_onnx("smollm2-135m-instruct") == first


def test_a_damaged_record_is_built_again_as_its_error_says(fake_build):
    from hybridllm.models import onnx_prepare, onnx_store

    final = fake_build / "onnx-int4-cpu"
    final.mkdir(parents=True)
    (final / "genai_config.json").write_text("{}")
    (final / "hybridllm.json").write_text('{"format_version": 2, "sou')  # damaged on disk
    # before: ModelCorruptError "...; prepare the model again." from the very command that does that
    assert onnx_prepare.prepare_onnx("smollm2-135m-instruct") == final
    assert onnx_store.read_meta(final)["model_id"] == "smollm2-135m-instruct"
