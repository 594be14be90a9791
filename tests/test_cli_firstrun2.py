"""First-run rough edges: `python -m hybridllm.demo` on the light install, a bad --threads value, and
the README's llama.cpp build command beside the Makefile's. Fast: nothing real is loaded or started."""

from __future__ import annotations

import re
import socket
import sys
from pathlib import Path

import pytest

from hybridllm import HybridLLMError, cli, demo

ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_on_the_light_install_says_which_extra_to_install(monkeypatch, capsys):
    """Before: 'error: the cloud server exited (1); see /tmp/.../cloud.log', and nothing about why."""
    started = []

    def start(*args, **kwargs):
        started.append(args)
        raise HybridLLMError("the cloud server exited (1); see cloud.log")

    monkeypatch.setattr(cli, "SERVER_MODULES", ("torch", "hybridllm_firstrun2_absent"))
    monkeypatch.setattr(demo, "_start_cloud", start)
    assert demo.main([]) == 1
    err = capsys.readouterr().err
    assert started == [] and len(err.strip().splitlines()) == 1, err
    assert "[server] extra" in err and "pip install 'hybridllm[server]'" in err, err
    assert "'hybridllm_firstrun2_absent'" in err and "hybridllm ask" in err, err


def test_a_cloud_server_that_stops_at_once_gives_its_reason(tmp_path, monkeypatch):
    """Before: only the exit status and the log's path; now the log's last line too."""
    fake = tmp_path / "hybridllm-cloud"
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint('starting')\n"
                    "print('hybridllm-cloud: error: no such thing here')\nsys.exit(3)\n")
    fake.chmod(0o755)
    monkeypatch.setattr(demo.shutil, "which", lambda name: str(fake))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(HybridLLMError) as err:
        demo._start_cloud(port, tmp_path / "cloud.log")
    assert "exited (3): hybridllm-cloud: error: no such thing here" in str(err.value)
    assert str(tmp_path / "cloud.log") in str(err.value)


@pytest.mark.parametrize("command", ["ask", "chat"])
@pytest.mark.parametrize("value", ["0", "-2", "513", "1.5", "many"])
def test_a_bad_threads_value_is_a_usage_error_naming_the_option(command, value, capsys):
    """Before: --threads 0 exited 1 with 'n_threads must be at least 1', not naming --threads."""
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "--threads", value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --threads" in err and "n_threads" not in err, err
    assert "from 1 to 512" in err, err


def test_a_good_threads_value_is_taken():
    args = cli.build_parser().parse_args(["ask", "hi", "--threads", "3"])
    assert args.threads == 3


def test_readme_builds_llama_cpp_as_the_makefile_does():
    """Before: the README's command had no version and fewer flags than the Makefile's build."""
    makefile = (ROOT / "Makefile").read_text()
    version = re.search(r"^LLAMA_VERSION\s*:=\s*(\S+)", makefile, re.M).group(1)
    flags = re.search(r"^ifeq \(\$\(shell uname -m\),x86_64\)\nLLAMA_CMAKE_ARGS \?= (.+)$", makefile,
                      re.M).group(1).strip()
    readme = (ROOT / "README.md").read_text()
    command = f'CMAKE_ARGS="{flags}" pip install --no-cache-dir llama-cpp-python=={version}'
    assert command in readme
