"""The real server (subprocess on loopback, real SmolLM2 weights) through the official client.

The server is started with the exact command the Dockerfile's ENTRYPOINT and CMD run, with the
model path, host, port and key overridden after them (argparse keeps the last occurrence).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .helpers import ROOT, free_port, metric_value, stop_process, wait_healthy_url

pytestmark = pytest.mark.real
openai = pytest.importorskip("openai")

KEY = "sk-real-test"
ENV_KEY = "sk-from-env"
MODEL = "smollm2-135m-instruct"
MAX_NUM_SEQS = 16
MAX_WAITING = 32
MESSAGES = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Name three colours of the rainbow."},
]


def dockerfile_command() -> list[str]:
    text = (ROOT / "cloud_server" / "Dockerfile").read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD\s+(\[.*\])\s*$", text, re.M).group(1))
    return entry + cmd


class RealServer:
    def __init__(self, url: str, proc: object, health_seen: list[int]) -> None:
        self.url = url
        self.proc = proc
        self.health_seen = health_seen

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def metric(self, name: str, **labels: str) -> float:
        value = metric_value(self.metrics(), name, model=MODEL, **labels)
        assert value is not None, name
        return value

    def counter(self, name: str, **labels: str) -> float:
        """A counter's value; a labelled series has no sample before its first increment: 0."""
        value = metric_value(self.metrics(), name, model=MODEL, **labels)
        return 0.0 if value is None else value


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[RealServer]:
    import subprocess

    command = dockerfile_command()
    assert command[:2] == ["hybridllm-cloud", "serve"]
    script = Path(sys.executable).with_name("hybridllm-cloud")
    executable = str(script) if script.exists() else shutil.which("hybridllm-cloud")
    assert executable, "the hybridllm-cloud console script is not installed"
    port = free_port()
    args = [
        executable,
        *command[1:],
        "--model",
        str(smollm2_path),
        "--served-model-name",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--api-key",
        KEY,
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--max-waiting",
        str(MAX_WAITING),
        "--max-model-len",
        "2048",
        "--log-level",
        "warning",
    ]
    env = {**os.environ, "HYBRIDLLM_CLOUD_API_KEYS": f"{ENV_KEY},sk-unused"}
    proc = subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        seen = wait_healthy_url(url, timeout_s=180, proc=proc)
    except Exception:
        print(stop_process(proc))
        raise
    yield RealServer(url, proc, seen)
    output = stop_process(proc)
    assert proc.returncode is not None
    assert "Traceback" not in output, output


@pytest.fixture(scope="module")
def client(server: RealServer) -> object:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def vocab(smollm2_path: Path) -> object:
    from llama_cpp import Llama

    return Llama(model_path=str(smollm2_path), vocab_only=True, verbose=False)


def test_health_was_503_while_loading(server: RealServer) -> None:
    assert server.health_seen[-1] == 200
    assert 503 in server.health_seen, server.health_seen


def test_model_list(server: RealServer, client: object) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    from_env = openai.OpenAI(base_url=f"{server.url}/v1", api_key=ENV_KEY, max_retries=0)
    assert [m.id for m in from_env.models.list().data] == [MODEL]


def test_chat_completion_and_usage(client: object) -> None:
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=16)
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 16
    assert r.usage.prompt_tokens > 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    r = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5


def test_streamed_chat_equals_non_streamed(client: object) -> None:
    kwargs = {"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 24}
    full = client.chat.completions.create(**kwargs)
    stream = client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    parts, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(parts) == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage is not None
    assert usage.prompt_tokens == full.usage.prompt_tokens
    assert usage.completion_tokens == full.usage.completion_tokens


def test_legacy_completion_usage_matches_llama_cpp_tokens(client: object, vocab: object) -> None:
    prompt = "The capital of France is"
    r = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.object == "text_completion"
    assert r.choices[0].text
    assert r.choices[0].finish_reason == "length"
    expected = len(vocab.tokenize(prompt.encode(), add_bos=True, special=True))
    assert r.usage.prompt_tokens == expected
    assert r.usage.completion_tokens == 12
    ids = vocab.tokenize(prompt.encode(), add_bos=False, special=True)
    r2 = client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0)
    assert r2.usage.prompt_tokens == len(ids)


def test_errors_through_the_official_client(server: RealServer, client: object) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=5)
    assert bad.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4096)
    assert too_long.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hi " * 2100, max_tokens=1)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-nope", messages=MESSAGES)
    assert missing.value.body["code"] == "model_not_found"
    wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        content=b'{"model": ',
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert r.status_code == 400
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_16_concurrent_streams_are_batched(server: RealServer) -> None:
    async def one(aclient: object) -> tuple[str, int]:
        stream = await aclient.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, tokens = [], 0
        async for chunk in stream:
            text += [c.delta.content or "" for c in chunk.choices]
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return "".join(text), tokens

    async def run() -> list[tuple[str, int]]:
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)
        async with aclient:
            return await asyncio.gather(*(one(aclient) for _ in range(16)))

    # deltas of this test's own traffic: the module's other tests may run before or after it
    names = (
        "hybridllm_generation_tokens_total",
        "hybridllm_time_to_first_token_seconds_count",
        "hybridllm_inter_token_latency_seconds_count",
    )
    before = {n: server.counter(n) for n in names}
    results = asyncio.run(run())
    assert len(results) == 16
    assert all(tokens == 24 and text for text, tokens in results)
    assert server.metric("hybridllm_batch_num_seqs_max") >= 8
    grew = {n: server.metric(n) - before[n] for n in names}
    assert grew["hybridllm_generation_tokens_total"] >= 16 * 24, grew
    assert grew["hybridllm_time_to_first_token_seconds_count"] >= 16, grew
    assert grew["hybridllm_inter_token_latency_seconds_count"] >= 16 * 23, grew


def wait_idle(server: RealServer, timeout_s: float = 20.0) -> dict[str, float]:
    names = (
        "hybridllm_num_requests_running",
        "hybridllm_num_requests_waiting",
        "hybridllm_kv_cache_blocks_free",
        "hybridllm_kv_cache_blocks_total",
        "hybridllm_kv_cache_usage_ratio",
    )
    deadline = time.monotonic() + timeout_s
    while True:
        text = server.metrics()
        values = {n: metric_value(text, n, model=MODEL) for n in names}
        idle = values[names[0]] == 0 and values[names[1]] == 0 and values[names[2]] == values[names[3]]
        if idle or time.monotonic() > deadline:
            return values
        time.sleep(0.1)


def test_200_requests_a_third_aborted_mid_stream_free_the_pool(server: RealServer) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}

    async def one(http: httpx.AsyncClient, i: int) -> str:
        if i % 3 == 0:  # stream, read a few chunks, hang up
            body = {
                "model": MODEL,
                "messages": MESSAGES,
                "max_tokens": 200,
                "stream": True,
                "ignore_eos": True,
            }
            async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                seen = 0
                async for line in r.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen >= 2:
                        break
            return "aborted"
        body = {
            "model": MODEL,
            "prompt": f"Question {i}: what is {i} plus {i}?",
            "max_tokens": 4,
            "stream": i % 3 == 1,
        }
        r = await http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return "done"

    async def run() -> list[str]:
        limits = httpx.Limits(max_connections=16)
        sem = asyncio.Semaphore(16)
        async with httpx.AsyncClient(
            base_url=server.url, headers=headers, timeout=120, limits=limits
        ) as http:

            async def bounded(i: int) -> str:
                async with sem:
                    return await one(http, i)

            return await asyncio.gather(*(bounded(i) for i in range(200)))

    aborts_before = (
        metric_value(
            server.metrics(),
            "hybridllm_requests_finished_total",
            model=MODEL,
            finish_reason="abort",
        )
        or 0
    )
    outcomes = asyncio.run(run())
    assert outcomes.count("aborted") == 67 and outcomes.count("done") == 133
    values = wait_idle(server)
    assert values["hybridllm_num_requests_running"] == 0
    assert values["hybridllm_num_requests_waiting"] == 0
    assert values["hybridllm_kv_cache_blocks_free"] == values["hybridllm_kv_cache_blocks_total"]
    assert values["hybridllm_kv_cache_usage_ratio"] == 0
    aborts = server.metric("hybridllm_requests_finished_total", finish_reason="abort")
    assert aborts - aborts_before >= 60


def test_full_queue_answers_429_with_retry_after(server: RealServer) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(
            base_url=server.url, headers=headers, timeout=120, limits=limits
        ) as http:
            body = {"model": MODEL, "prompt": "Count to ten:", "max_tokens": 2, "ignore_eos": True}
            return await asyncio.gather(
                *(http.post("/v1/completions", json=body) for _ in range(MAX_NUM_SEQS + MAX_WAITING + 24))
            )

    responses = asyncio.run(run())
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    limited = [r for r in responses if r.status_code == 429]
    assert limited, "no request was refused although the queue bound was exceeded"
    assert int(limited[0].headers["Retry-After"]) >= 1
    assert limited[0].json()["error"]["type"] == "requests"
    assert statuses.count(200) >= MAX_NUM_SEQS
    values = wait_idle(server)
    assert values["hybridllm_kv_cache_blocks_free"] == values["hybridllm_kv_cache_blocks_total"]
