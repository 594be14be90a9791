"""A `hybridllm` command started with stdout closed (`hybridllm ask hi >&-`): Python has no
sys.stdout then, and the command's result had nowhere to go. `ask`, `config show` and `models list`
exited 0 with it thrown away; `router eval --json` ended in "internal error: AttributeError", and
`router calibrate` did so after rewriting the router, and `serve` after loading the model
(uvicorn's log setup needs a stdout). Now it is a usage error (exit 2) before anything loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hybridllm.cli import main


@pytest.mark.parametrize("argv", [
    ["config", "show"],
    ["models", "list"],
    ["models", "list", "--json"],
    ["ask", "hi"],
    ["serve", "--port", "0"],
    ["router", "calibrate", "--prompts", "p.txt", "--cloud-fraction", "0.3", "--router", "r"],
])
def test_closed_stdout_is_a_usage_error(argv, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HYBRIDLLM_CONFIG", os.devnull)
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdout", None)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"hybridllm {argv[0]}: error: stdout is closed" in err
    assert not (tmp_path / "home").exists() and not (tmp_path / "r").exists()


def test_closed_stdout_in_a_real_process(tmp_path):
    env = {**os.environ, "HYBRIDLLM_CONFIG": os.devnull, "HYBRIDLLM_HOME": str(tmp_path / "home"),
           "HYBRIDLLM_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "hybridllm", "config", "show"], env=env,
                          stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "stdout is closed" in proc.stderr and "Traceback" not in proc.stderr


def test_open_stdout_still_works(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HYBRIDLLM_CONFIG", os.devnull)
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))
    assert main(["config", "show"]) == 0
    assert '"edge_model"' in capsys.readouterr().out
