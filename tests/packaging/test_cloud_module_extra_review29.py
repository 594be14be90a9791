"""``python -m cloud_server`` without the [server] extra says what to install on one line, as
``hybridllm-cloud`` does (one check: ``hybridllm.cli.cloud_main``). Before, it printed the traceback
of its first import that failed (pydantic on the light install, FastAPI or torch on [proxy]). The
missing modules are simulated in the subprocess (a sitecustomize that makes them unimportable)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# what the light install (no extra) and [proxy] (FastAPI, pydantic, uvicorn) lack of [server]
LIGHT = ("torch", "fastapi", "uvicorn", "gguf", "prometheus_client", "pydantic", "starlette")
PROXY = ("torch", "gguf", "prometheus_client")
SERVE = ["serve", "--model", "smollm2-135m-instruct", "--port", "0"]


def _run(tmp_path: Path, blocked: tuple[str, ...], *command: str) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    # None in sys.modules: find_spec finds nothing and an import fails, as without the package
    (site / "sitecustomize.py").write_text(f"import sys\nsys.modules.update(dict.fromkeys({blocked!r}))\n")
    env = {**os.environ, "PYTHONPATH": str(site), "HYBRIDLLM_HOME": str(tmp_path / "home")}
    env.pop("HYBRIDLLM_DEBUG", None)
    return subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("blocked", [LIGHT, PROXY], ids=["light", "proxy"])
def test_python_m_cloud_server_without_the_extra_says_what_to_install(tmp_path, blocked) -> None:
    done = _run(tmp_path, blocked, "-m", "cloud_server", *SERVE)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("hybridllm-cloud: error: the cloud server needs the [server] extra")
    assert "lacks 'torch'" in done.stderr and "pip install 'hybridllm[server]'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    # word for word what the hybridllm-cloud command prints
    script = "import sys; from hybridllm.cli import cloud_main; sys.exit(cloud_main())"
    command = _run(tmp_path, blocked, "-c", script, *SERVE)
    assert (command.returncode, command.stderr) == (done.returncode, done.stderr)
