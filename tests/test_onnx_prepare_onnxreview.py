"""Preparing an ONNX folder from two processes at once builds it once.

The build's heavy steps (GGUF -> Hugging Face folder, the model builder, the GGUF block rewrite)
are replaced by quick stand-ins that take a second and count their runs in a shared file; the
locking, the re-check and the rename are the real code, in two real processes. (Measured on the
real build before the fix: two processes that started 2 s apart on an empty data dir both ran the
model builder, 27 s each on 2 cores.)
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the build lock is fcntl's")

_PREPARE = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path

    from hybridllm.models import onnx_gguf, onnx_prepare
    import cloud_server.models.export_hf as export_hf

    counter = Path(sys.argv[1])

    def fake_hf(gguf, out):
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps({"num_hidden_layers": 1}))
        (out / "tokenizer_config.json").write_text("{}")
        return out

    def fake_builder(cmd, log, num_matmuls, progress, span):
        with counter.open("a") as f:
            f.write("built\\n")
        time.sleep(1.5)  # long enough for the other process to arrive meanwhile
        out = Path(cmd[cmd.index("-o") + 1])
        out.mkdir(parents=True)
        (out / "genai_config.json").write_text("{}")

    export_hf.gguf_to_hf_folder = fake_hf
    onnx_prepare._run_builder = fake_builder
    onnx_prepare.missing_export_modules = lambda: []
    onnx_prepare.pull = lambda model_id: Path("unused.gguf")
    onnx_gguf.rewrite = lambda model, gguf: {}
    print(onnx_prepare.prepare_onnx("smollm2-135m-instruct"))
    """
)


def test_two_processes_preparing_at_once_build_once(tmp_path):
    import os

    env = dict(os.environ, HYBRIDLLM_HOME=str(tmp_path / "home"))
    counter = tmp_path / "builds.txt"
    procs = [
        subprocess.Popen([sys.executable, "-c", _PREPARE, str(counter)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    folders = {out.strip().splitlines()[-1] for out, _ in outs}
    assert folders == {str(tmp_path / "home" / "models" / "smollm2-135m-instruct" / "onnx-int4-cpu")}
    assert counter.read_text().count("built") == 1  # the second found the first one's folder
    final = tmp_path / "home" / "models" / "smollm2-135m-instruct" / "onnx-int4-cpu"
    assert (final / "genai_config.json").is_file() and (final / "hybridllm.json").is_file()
    leftovers = [p.name for p in final.parent.iterdir() if p.name.endswith((".tmp", ".old", ".log"))]
    assert not leftovers
