"""The official openai client against `hybridllm serve` (a real subprocess, real models)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cloud_server.api.helpers import wait_healthy_url

from .conftest import ROOT, running_proxy

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def proxy(cloud, tmp_path_factory):
    with running_proxy(cloud.url, tmp_path_factory.mktemp("proxy")) as url:
        yield url


@pytest.fixture
def client(proxy):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0)


def test_models(client):
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == "hybridllm" and "smollm2-135m-instruct" in ids


def test_chat_reports_the_route(client):
    raw = client.chat.completions.with_raw_response.create(
        model="hybridllm", messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0, max_tokens=24)
    r = raw.parse()
    route = raw.headers["x-hybridllm-route"]
    assert route in ("edge", "cloud", "cache")
    assert "Paris" in r.choices[0].message.content
    assert r.usage.completion_tokens > 0
    assert r.model_extra["hybridllm"]["route"] == route


def test_forced_cloud_and_streaming_equal_non_streaming(client):
    body = {"model": "hybridllm", "temperature": 0, "max_tokens": 20,
            "messages": [{"role": "user", "content": "List two fruits."}],
            "extra_body": {"hybridllm": {"route": "cloud"}}}
    full = client.chat.completions.create(**body)
    assert full.model_extra["hybridllm"]["route"] == "cloud"
    stream = client.chat.completions.create(**body, stream=True,
                                            stream_options={"include_usage": True})
    text, usage = "", None
    for event in stream:
        if event.choices:
            text += event.choices[0].delta.content or ""
        if event.usage:
            usage = event.usage
    assert text == full.choices[0].message.content
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens


def test_bad_request_is_an_openai_error(client):
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="hybridllm", messages=[], max_tokens=5)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="hybridllm", max_tokens=-1,
                                       messages=[{"role": "user", "content": "hi"}])


def test_sigterm_ends_a_long_device_stream_in_band_and_exits_0(tmp_path):
    """`hybridllm serve --port 0 --shutdown-timeout 0` on the real device model alone: the banner
    names the port the system chose; SIGTERM mid-answer ends the stream with an OpenAI error event
    and [DONE] (before: uvicorn waited for the whole answer, then the process died by the signal,
    status -15), and the process exits 0 with no traceback."""
    import re
    import signal
    import time

    import httpx

    env = {**os.environ, "HYBRIDLLM_CACHE_DIR": str(tmp_path), "HYBRIDLLM_N_CTX": "2048"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hybridllm.cli", "serve", "--port", "0", "--no-cache",
         "--shutdown-timeout", "0", "--log-level", "info"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        banner = ""
        deadline = time.monotonic() + 180
        while "hybridllm serve: http" not in banner and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"the server ended before its banner:\n{banner}"
            banner += line
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/v1", banner).group(1))
        assert port != 0
        url = f"http://127.0.0.1:{port}"
        wait_healthy_url(url, 60, proc)
        body = {"model": "hybridllm", "stream": True, "max_tokens": 1000, "temperature": 0,
                "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
                "hybridllm": {"route": "edge"}}
        lines: list[str] = []
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                lines.append(line)
                if len(lines) == 8:  # text is streaming
                    proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    data = [ln[6:] for ln in lines if ln.startswith("data: ")]
    assert data[-1] == "[DONE]", lines[-5:]
    assert json.loads(data[-2])["error"]["code"] == "server_shutting_down", data[-3:]
    assert proc.returncode == 0, output
    assert "Traceback" not in output and "CancelledError" not in output, output
