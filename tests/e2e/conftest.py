"""A real cloud server process (hybridllm-cloud on the embedded SmolLM2) for the end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cloud_server.api.helpers import free_port, wait_healthy_url

ROOT = Path(__file__).resolve().parents[2]


class CloudProcess:
    """`hybridllm-cloud serve` on a fixed loopback port, which can be stopped and started again."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / "cloud.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cloud_server", "serve", "--model", "smollm2-135m-instruct",
             "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT, env=os.environ.copy(), stdout=self.log.open("a"), stderr=subprocess.STDOUT)
        wait_healthy_url(self.url, 240, self.proc)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture(scope="package")
def cloud(tmp_path_factory):
    server = CloudProcess(tmp_path_factory.mktemp("cloud"))
    server.start()
    yield server
    server.stop()


@contextmanager
def running_proxy(cloud_url: str, log_dir: Path, *args: str) -> Iterator[str]:
    """``hybridllm serve`` (real device model) on a free port in front of ``cloud_url``: yields its
    base URL; stopped after, and its output must hold no traceback."""
    port = free_port()
    log = log_dir / "proxy.log"
    env = {**os.environ, "HYBRIDLLM_CACHE_DIR": str(log_dir), "HYBRIDLLM_N_CTX": "2048"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hybridllm.cli", "serve", "--port", str(port), "--cloud-url", cloud_url,
         *args],
        cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy_url(url, 180, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "Traceback" not in log.read_text()
