"""An engine that dies while serving ends the server: the requests in flight get an error that names
the engine's failure, new ones are refused, and the process exits with status 1 and a log line
naming the error, so that a supervisor (systemd, Kubernetes) restarts it, as vLLM's server does.

Before, once the engine's loop had died, ``/health`` said error but the process served on for ever:
new requests got 503s and those in flight waited for tokens that never came.

The real server process runs the real engine (SmolLM2) with one fault injected: adding a request
whose ``max_tokens`` is 13 raises an exception the engine loop does not catch, as a bug in it would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from cloud_server.api.server import create_app
from cloud_server.exceptions import EngineError

from .api.fake_engine import FakeEngine
from .api.helpers import ROOT, ThreadServer, free_port, stop_process, wait_healthy_url

MODEL = "smollm2-135m-instruct"
FATAL_MAX_TOKENS = 13

INJECT = textwrap.dedent(f"""
    import sys
    from cloud_server.engine.llm_engine import LLMEngine
    from cloud_server.__main__ import main

    class InjectedFault(BaseException):
        pass

    add_request = LLMEngine.add_request

    def faulty_add_request(self, request_id, prompt_ids, params, *args, **kwargs):
        if params.max_tokens == {FATAL_MAX_TOKENS}:
            raise InjectedFault("the engine's state is broken")
        return add_request(self, request_id, prompt_ids, params, *args, **kwargs)

    LLMEngine.add_request = faulty_add_request
    sys.exit(main(sys.argv[1:]))
""")


def test_a_dead_engine_ends_the_requests_in_flight_and_reports_it() -> None:
    engine = FakeEngine(step_s=30.0)  # a request in it waits for its first token
    dead: list[EngineError] = []
    app = create_app(lambda: engine, on_engine_dead=dead.append)
    server = ThreadServer(app).start()
    answers: list[httpx.Response] = []
    body = {"model": "fake-model", "prompt": "hi", "max_tokens": 2}
    waiter = threading.Thread(target=lambda: answers.append(
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)))
    try:
        waiter.start()
        deadline = time.monotonic() + 10
        while not engine.live and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.live  # in flight
        start = time.monotonic()
        engine.is_ready = False  # its loop ended
        waiter.join(timeout=15)
        took = time.monotonic() - start
        assert answers, "the request in flight was never answered"
        response = answers[0]
        assert response.status_code == 500, response.text
        assert response.json()["error"]["code"] == "engine_dead"
        assert "The engine failed" in response.json()["error"]["message"]
        assert took < 5.0
        while not dead and time.monotonic() < start + 10:  # once the answers are out
            time.sleep(0.01)
        assert len(dead) == 1 and "its loop ended" in str(dead[0])
        later = httpx.post(f"{server.url}/v1/completions", json=body, timeout=10)
        assert later.status_code >= 500 and "The engine failed" in later.text
    finally:
        server.stop()


def test_without_the_hook_nothing_changes() -> None:
    engine = FakeEngine()
    server = ThreadServer(create_app(lambda: engine)).start()
    try:
        engine.is_ready = False
        time.sleep(0.5)
        response = httpx.get(f"{server.url}/health")
        assert (response.status_code, response.json()) == (503, {"status": "error"})
    finally:
        server.stop()


def _stream(url: str, events: list[Any], started: threading.Event) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        events.append(response.status_code)
        for line in response.iter_lines():
            if line.startswith("data: "):
                started.set()
                data = line[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))


@pytest.mark.real
def test_the_real_server_exits_when_its_engine_dies(smollm2_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-c", INJECT, "serve", "--model", str(smollm2_path), "--served-model-name",
         MODEL, "--port", str(port), "--num-threads", "1", "--max-model-len", "512"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "HYBRIDLLM_CPU_KERNELS": "0"},  # torch's kernels: no build to wait for
    )
    events: list[Any] = []
    started = threading.Event()
    try:
        wait_healthy_url(url, 120, proc)
        streamer = threading.Thread(target=_stream, args=(url, events, started))
        streamer.start()
        assert started.wait(60), events  # a stream in flight
        fatal = httpx.post(f"{url}/v1/completions", timeout=60,
                           json={"model": MODEL, "prompt": "Hello", "max_tokens": FATAL_MAX_TOKENS})
        answered = time.monotonic()
        streamer.join(timeout=30)
        code = proc.wait(timeout=30)
        exited_after = time.monotonic() - answered
    finally:
        output = stop_process(proc, timeout_s=5)
    # the request that broke it, and the stream that was running, both end with the reason
    assert fatal.status_code == 500, fatal.text
    assert fatal.json()["error"]["code"] == "engine_dead"
    assert "The engine failed (InjectedFault)" in fatal.json()["error"]["message"]
    assert events[0] == 200 and events[-1] == "[DONE]", events[-3:]
    assert "InjectedFault" in events[-2]["error"]["message"], events[-3:]
    # and the process ends, status 1, its reason logged and as the last line
    assert code == 1, output
    assert exited_after < 10.0, output  # nothing left waiting on the dead engine
    assert "graceful shutdown exceeded" not in output and "shutdown failed" not in output, output
    assert "the engine stopped (InjectedFault: the engine's state is broken)" in output, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("hybridllm-cloud: error: the engine failed while serving (InjectedFault"), last
