"""`make run` (python -m hybridllm.demo) stopped by Ctrl-C: no traceback, and no cloud server left
running behind it. Fast: a stand-in server script, nothing real is loaded."""

from __future__ import annotations

import socket
import sys

import pytest

from hybridllm import cli, demo


def test_ctrl_c_while_the_cloud_loads_stops_the_server(tmp_path, monkeypatch):
    """Before: the server started, Ctrl-C reached only the demo (kill -INT PID, a supervisor), and
    _start_cloud left the server running with nobody to stop it."""
    fake = tmp_path / "hybridllm-cloud"
    fake.write_text(f"#!{sys.executable}\nimport time\nprint('loading', flush=True)\ntime.sleep(120)\n")
    fake.chmod(0o755)
    monkeypatch.setattr(demo.shutil, "which", lambda name: str(fake))
    started = []
    popen = demo.subprocess.Popen

    def record(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]

    sleep, pressed = demo.time.sleep, []

    def ctrl_c(seconds):  # the first wait is interrupted; later ones (Popen.wait's) are real
        if not pressed:
            pressed.append(seconds)
            raise KeyboardInterrupt
        sleep(seconds)

    monkeypatch.setattr(demo.subprocess, "Popen", record)
    monkeypatch.setattr(demo.time, "sleep", ctrl_c)
    with socket.socket() as s:  # a port nobody listens on: never healthy
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        with pytest.raises(KeyboardInterrupt):
            demo._start_cloud(port, tmp_path / "cloud.log")
        assert len(started) == 1
        assert started[0].poll() is not None  # stopped and reaped
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_ctrl_c_in_the_demo_is_one_line_and_exit_130(monkeypatch, capsys):
    """Before: a KeyboardInterrupt traceback at the end of `make run`."""
    def start(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "SERVER_MODULES", ("sys",))  # the [server] extra counts as installed
    monkeypatch.setattr(demo, "_start_cloud", start)
    try:
        code = demo.main([])
    except KeyboardInterrupt:  # the old code let it through (pytest itself would stop here)
        pytest.fail("the demo let Ctrl-C through as a traceback")
    assert code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "interrupted"
