"""Preparing an ONNX folder when things go wrong: an interrupt, a rebuild, a GGUF the converter
cannot take, a folder from another version or with a damaged genai_config.json.

The heavy steps are quick stand-ins (as in tests/models/test_onnx_prepare_review14.py); the lock,
the swap, the checks and the builder's subprocess handling are the real code.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from hybridllm import HybridLLMError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the build lock is fcntl's")

MODEL = "smollm2-135m-instruct"


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
        (out / "genai_config.json").write_text('{"model": {}}')
        (out / "model.onnx").write_text("new")

    monkeypatch.setattr(export_hf, "gguf_to_hf_folder", fake_hf)
    monkeypatch.setattr(onnx_prepare, "_run_builder", fake_builder)
    monkeypatch.setattr(onnx_prepare, "missing_export_modules", lambda: [])
    monkeypatch.setattr(onnx_prepare, "pull", lambda model_id: Path("unused.gguf"))
    monkeypatch.setattr(onnx_gguf, "rewrite", lambda model, gguf: {})
    return tmp_path / "home" / "models" / MODEL / "onnx-int4-cpu"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_interrupted_build_does_not_leave_the_builder_running(tmp_path):
    """A SIGINT to this process alone (a notebook's interrupt button, a supervisor) raises
    KeyboardInterrupt here; before, the builder ran on for minutes, orphaned."""
    from hybridllm.models import onnx_prepare

    pid_file = tmp_path / "pid"
    child = (
        "import os, sys, time; "
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
        "print('complete quantization of /model/layers.0/attn/qkv_proj/MatMul', flush=True); "
        "time.sleep(60)"
    )

    def interrupt(done, total):
        raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        onnx_prepare._run_builder([sys.executable, "-c", child], tmp_path / "log", 1, interrupt, (25, 90))
    pid = int(pid_file.read_text())
    try:
        assert not _alive(pid), "the builder is still running"
        assert time.monotonic() - started < 30
    finally:
        if _alive(pid):
            os.kill(pid, 9)


def test_an_interrupt_while_the_old_folder_is_removed_keeps_the_new_build(fake_build, monkeypatch):
    """`--force` (or a stale folder) swaps a new build in; removing the old folder takes a while
    (gigabytes). Before: the old folder was removed first, so an interrupt meanwhile lost both."""
    from hybridllm.models import onnx_prepare

    final = fake_build
    final.mkdir(parents=True)
    (final / "genai_config.json").write_text("{}")
    (final / "model.onnx").write_text("old")
    real_rmtree = shutil.rmtree

    def slow_rmtree(path, *args, **kwargs):
        if str(path).endswith(".old"):
            raise KeyboardInterrupt  # Ctrl-C while the old folder is being removed
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", slow_rmtree)
    with pytest.raises(KeyboardInterrupt):
        onnx_prepare.prepare_onnx(MODEL, force=True)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert (final / "model.onnx").read_text() == "new"
    assert (final / "hybridllm.json").is_file()
    # the half-removed old folder is a build's leftover: the next build sweeps it
    onnx_prepare.prepare_onnx(MODEL, force=True)
    assert [p.name for p in final.parent.iterdir() if p.name.endswith(".old")] == []


def _tiny_gguf(path: Path, arch: str) -> Path:
    """A header-only GGUF of ``arch`` with one tensor (no weights to speak of)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b"])
    w.add_tensor("token_embd.weight", np.zeros((2, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_gguf_the_exporter_cannot_take_is_a_clear_error_naming_its_architecture(
    fake_build, tmp_path, monkeypatch
):
    """The real exporter on a phi3 GGUF. Before: its ModelLoadError is no HybridLLMError, so
    `models prepare` printed "internal error: ModelLoadError ... please report it"."""
    import cloud_server.models.export_hf as export_hf
    from hybridllm.models import onnx_prepare

    monkeypatch.undo()  # the real exporter; the rest of the build stand-ins again below
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(onnx_prepare, "missing_export_modules", lambda: [])
    monkeypatch.setattr(onnx_prepare, "_run_builder", lambda *a: pytest.fail("built"))
    gguf = _tiny_gguf(tmp_path / "phi.gguf", "phi3")
    monkeypatch.setattr(onnx_prepare, "pull", lambda model_id: gguf)
    assert export_hf.gguf_to_hf_folder.__module__ == "cloud_server.models.export_hf"

    with pytest.raises(HybridLLMError, match=r"'phi3'.*llama\.cpp backend"):
        onnx_prepare.prepare_onnx(MODEL)
    assert not fake_build.exists()
    assert [p.name for p in fake_build.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_gemma3_in_the_catalog_names_its_architecture(fake_build, tmp_path, monkeypatch):
    """gemma3-270m is a catalog chat model, and the exporter converts llama and qwen2 only
    (its error, as export_hf raises it, without a real 270M-weight export here)."""
    import cloud_server.models.export_hf as export_hf
    from cloud_server.exceptions import ModelLoadError
    from hybridllm.models import onnx_prepare

    gguf = _tiny_gguf(tmp_path / "gemma.gguf", "gemma3")
    monkeypatch.setattr(onnx_prepare, "pull", lambda model_id: gguf)

    def refuse(path, out):
        raise ModelLoadError("gguf_to_hf_folder supports Llama and Qwen2 models with a GPT-2 BPE vocabulary")

    monkeypatch.setattr(export_hf, "gguf_to_hf_folder", refuse)
    with pytest.raises(HybridLLMError, match=r"'gemma3-270m' cannot be prepared .*'gemma3'"):
        onnx_prepare.prepare_onnx("gemma3-270m")


def test_the_cli_says_it_in_one_error_line(fake_build, tmp_path, monkeypatch, capsys):
    import cloud_server.models.export_hf as export_hf
    from cloud_server.exceptions import ModelLoadError
    from hybridllm import cli
    from hybridllm.models import onnx_prepare

    gguf = _tiny_gguf(tmp_path / "gemma.gguf", "gemma3")
    monkeypatch.setattr(onnx_prepare, "pull", lambda model_id: gguf)

    def refuse(path, out):
        raise ModelLoadError("gguf_to_hf_folder supports Llama and Qwen2 models")

    monkeypatch.setattr(export_hf, "gguf_to_hf_folder", refuse)
    code = cli.main(["models", "prepare", "gemma3-270m", "--backend", "onnx"])
    err = capsys.readouterr().err
    assert code == 1
    assert "internal error" not in err
    assert "error: 'gemma3-270m' cannot be prepared for ONNX Runtime" in err


@pytest.mark.parametrize(
    ("record", "says"),
    [
        ({"format_version": 1, "source_sha256": "x"}, r"format 1, from another hybridllm version"),
        ({}, r"format unknown"),  # a folder the builder wrote directly
        ({"format_version": 2, "source_sha256": "abcdef0123456789"},
         r"built from weights with sha256 abcdef012345"),
    ],
)
def test_a_folder_from_another_version_is_not_called_missing(tmp_path, monkeypatch, record, says):
    """A folder copied from a machine with another hybridllm version, onto a light install.
    Before: "The ONNX form of ... is not in FOLDER", with the folder right there."""
    from hybridllm.models import onnx_store

    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))
    folder = onnx_store.onnx_dir(MODEL)
    folder.mkdir(parents=True)
    (folder / "genai_config.json").write_text("{}")
    if record:
        (folder / "hybridllm.json").write_text(json.dumps(record))
    with pytest.raises(HybridLLMError, match=rf"is out of date \({says}") as info:
        onnx_store.resolve_onnx(MODEL, prepare=False)
    assert "is not in" not in str(info.value)
    assert "--backend onnx" in str(info.value)
