"""Run servers for the API tests: in a thread (fake engine) or as a subprocess (real model)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ThreadServer:
    """uvicorn on 127.0.0.1 in a daemon thread; ``stop`` waits for a clean shutdown."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, wait_healthy: bool = True, timeout_s: float = 10.0) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start")
            time.sleep(0.01)
        if wait_healthy:
            wait_healthy_url(self.url, timeout_s)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def wait_healthy_url(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> list[int]:
    """Poll /health until 200; returns every status seen (so a test can see the 503s first)."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            status = httpx.get(f"{url}/health", timeout=2).status_code
        except httpx.TransportError:
            status = 0
        seen.append(status)
        if status == 200:
            return seen
        time.sleep(0.05)
    raise TimeoutError(f"{url}/health not 200 after {timeout_s}s (saw {sorted(set(seen))})")


def spawn_server(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cloud_server", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop_process(proc: subprocess.Popen, timeout_s: float = 15.0) -> str:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    return proc.stdout.read() if proc.stdout else ""


@contextlib.contextmanager
def served_smollm2(model_path: Path, name: str, *args: str) -> Iterator[str]:
    """``hybridllm-cloud serve`` of ``model_path`` as ``name`` on a free port (``args``: more
    options), healthy: yields its base URL; stopped after, and its output must hold no traceback."""
    port = free_port()
    proc = spawn_server(["serve", "--model", str(model_path), "--served-model-name", name,
                         "--port", str(port), "--log-level", "warning", *args])
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy_url(base, timeout_s=180, proc=proc)
    except Exception:
        print(stop_process(proc))
        raise
    yield base
    output = stop_process(proc)
    assert "Traceback" not in output, output


def sse_payloads(lines: Iterator[str]) -> list[Any]:
    """The JSON payloads of an SSE stream, with "[DONE]" kept as the string."""
    out: list[Any] = []
    for line in lines:
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """One sample's value from Prometheus text, matched by name and a subset of labels."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_text = head.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            return float(value)
    return None
