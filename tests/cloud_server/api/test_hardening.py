"""Issue 19 on the REAL engine (SmolLM2 weights, in-process uvicorn): one bad request never hurts
another, a huge body never stalls the event loop, a burst fills the batch before it queues, and a
short schemathesis run against the real thing."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cloud_server.api.server import create_app
from hybridllm.wire.body import DEFAULT_MAX_BODY_BYTES
from hybridllm.wire.requests import MAX_MODEL_CHARS

from .helpers import ThreadServer, sse_payloads

pytestmark = pytest.mark.real

MODEL = "smol"
MAX_NUM_SEQS = 16
MAX_WAITING = 4
MSGS = [{"role": "user", "content": "Count from one to one hundred."}]


class _BodyMeter:
    """ASGI wrapper that counts the body bytes the app pulled for the latest POST: what "refused
    before it is read whole" means, measured without a clock."""

    def __init__(self, app: Any) -> None:
        self.app, self.read = app, 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        self.read = 0

        async def counted() -> Any:
            message = await receive()
            self.read += len(message.get("body", b""))
            return message

        return await self.app(scope, counted, send)


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[ThreadServer]:
    from cloud_server.config import EngineConfig
    from cloud_server.engine.async_engine import AsyncLLMEngine

    config = EngineConfig(str(smollm2_path), max_model_len=512, kv_cache_memory_bytes=128 << 20,
                          max_num_seqs=MAX_NUM_SEQS, max_waiting=MAX_WAITING)
    meter = _BodyMeter(create_app(lambda: AsyncLLMEngine(config), served_model_name=MODEL))
    srv = ThreadServer(meter)
    srv.meter = meter  # type: ignore[attr-defined]
    srv.start(timeout_s=180)
    yield srv
    srv.stop()


def _wait_idle(srv: ThreadServer) -> None:
    """No request running or waiting (every test starts from an idle engine)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = httpx.get(f"{srv.url}/metrics").text
        busy = [ln for ln in text.splitlines() if ln.startswith(("hybridllm_num_requests_running",
                                                                 "hybridllm_num_requests_waiting"))]
        if all(ln.rstrip().endswith(" 0.0") or ln.rstrip().endswith(" 0") for ln in busy):
            return
        time.sleep(0.05)
    raise TimeoutError("engine still busy")


def _body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MSGS, "max_tokens": 8, **fields}


# Every way a single request could have poisoned the batch (issue 19 items 1, 2, 4, 9), each as
# (path, raw body). Each must be a 4xx at the door and leave the streams in flight untouched.
POISON: list[tuple[str, bytes]] = [
    ("/v1/chat/completions", json.dumps(_body(seed=1180591620717411303424)).encode()),
    ("/v1/chat/completions", json.dumps(_body(seed=-(2**63) - 1)).encode()),
    ("/v1/chat/completions", json.dumps(_body(top_p=1e-300)).encode()),
    ("/v1/chat/completions", json.dumps(_body(top_p=1e-39, stream=True)).encode()),
    ("/v1/chat/completions", json.dumps(_body(top_k=10**30)).encode()),
    ("/v1/chat/completions", json.dumps(_body(max_tokens=10**30)).encode()),
    ("/v1/chat/completions", json.dumps(_body(stop_token_ids=[2**40])).encode()),
    ("/v1/chat/completions", json.dumps(_body(stop_token_ids=[-1])).encode()),
    ("/v1/chat/completions", json.dumps(_body(stream="yes")).encode()),
    ("/v1/chat/completions", json.dumps(_body(stop=5)).encode()),
    ("/v1/chat/completions", json.dumps(_body(stream_options="x")).encode()),
    ("/v1/chat/completions",
     json.dumps(_body(messages=[{"role": "user", "content": [{"type": "text", "text": {}}]}])).encode()),
    ("/v1/chat/completions", json.dumps(_body(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])).encode()),
    ("/v1/chat/completions",
     b'{"model": "smol", "max_tokens": 8, "messages": [{"role": "user", "content": "hi \\ud800 there"}]}'),
    ("/v1/chat/completions", b'{"model": "smol", "messages": [], "x": ' + b"[" * 2000 + b"]" * 2000 + b"}"),
    ("/v1/chat/completions", b'{"model": "smol", "max_tokens": 8, "temperature": NaN, "messages": []}'),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": [10**9], "max_tokens": 4}).encode()),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": [1, 2**70], "max_tokens": 4}).encode()),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "hi", "seed": 2**64}).encode()),
]


def test_poison_requests_are_refused_and_streams_in_flight_finish(server: ThreadServer) -> None:
    _wait_idle(server)
    max_tokens = 96
    results: list[dict[str, Any]] = [{} for _ in range(4)]
    started = threading.Barrier(5)

    def stream(i: int) -> None:
        body = {"model": MODEL, "messages": MSGS, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=120) as r:
            lines = r.iter_lines()
            first = [next(lines), next(lines)]  # the role chunk and the first token
            started.wait(timeout=60)
            events = sse_payloads(iter(first + list(lines)))
        results[i] = {"status": r.status_code, "events": events, "ended": time.monotonic()}

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    started.wait(timeout=60)  # all 4 are generating
    statuses = []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for path, body in POISON:
            r = client.post(path, content=body, headers={"content-type": "application/json"})
            statuses.append(r.status_code)
            assert 400 <= r.status_code < 500, (body[:120], r.status_code, r.text)
            assert r.json()["error"]["type"] == "invalid_request_error"
    poisoned_at = time.monotonic()
    for t in threads:
        t.join(timeout=120)
    for res in results:
        assert res["status"] == 200
        events = res["events"]
        assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1] if isinstance(e, dict))
        finishes = [c["choices"][0]["finish_reason"] for c in events[:-1] if c["choices"]]
        assert finishes[-1] == "length"
        assert events[-2]["usage"]["completion_tokens"] == max_tokens
        assert res["ended"] > poisoned_at  # the poison really arrived while they ran
    assert set(statuses) == {400}


def _health_latencies(url: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            assert client.get(f"{url}/health").status_code == 200
            out.append(time.perf_counter() - t0)
            time.sleep(0.01)


def _while_polling_health(url: str, work: Any) -> tuple[Any, list[float]]:
    stop, latencies = threading.Event(), []
    poller = threading.Thread(target=_health_latencies, args=(url, stop, latencies))
    poller.start()
    time.sleep(0.1)
    try:
        result = work()
    finally:
        time.sleep(0.1)
        stop.set()
        poller.join()
    return result, latencies


def _quick_under_load(
    url: str, work: Any, *, bound_s: float = 0.2, tries: int = 3
) -> tuple[Any, list[float]]:
    """Run `work` while polling /health until one try sees every poll answered within `bound_s`.

    A blocked event loop stalls /health on every try; a neighbour process on a shared 2-core
    machine stalls it now and then (CI once saw a single 0.47 s poll among hundreds under 2 ms).
    The last try is returned either way, so a loop that really blocks still fails the assertion.
    """
    for _ in range(tries):
        result, latencies = _while_polling_health(url, work)
        if latencies and max(latencies) < bound_s:
            break
    return result, latencies


def test_ten_megabyte_body_is_a_fast_413_and_health_stays_quick(server: ThreadServer) -> None:
    big = json.dumps(_body(messages=[{"role": "user", "content": "word " * 2_000_000}])).encode()
    assert len(big) > 10_000_000

    def send() -> tuple[int, float]:
        t0 = time.perf_counter()
        r = httpx.post(f"{server.url}/v1/chat/completions", content=big,
                       headers={"content-type": "application/json"}, timeout=60)
        assert r.json()["error"]["code"] == "request_too_large"
        return r.status_code, time.perf_counter() - t0

    (status, seconds), latencies = _quick_under_load(server.url, send)
    assert status == 413 and seconds < 2.0
    assert server.meter.read == 0  # type: ignore[attr-defined]  # refused on Content-Length alone
    assert latencies and max(latencies) < 0.2, max(latencies)

    def send_chunked() -> int:  # no Content-Length: refused as soon as the limit is passed
        def chunks() -> Iterator[bytes]:
            for i in range(0, len(big), 1 << 20):
                yield big[i : i + (1 << 20)]

        r = httpx.post(f"{server.url}/v1/chat/completions", content=chunks(),
                       headers={"content-type": "application/json"}, timeout=60)
        return r.status_code

    status, latencies = _quick_under_load(server.url, send_chunked)
    assert status == 413 and max(latencies) < 0.2, max(latencies)
    # refused in the message that crossed the limit: at most one more message (uvicorn hands the
    # app what one socket read gave, 64 KiB here) past the 4 MiB, never the whole 10 MB
    read = server.meter.read  # type: ignore[attr-defined]
    assert DEFAULT_MAX_BODY_BYTES < read <= DEFAULT_MAX_BODY_BYTES + (1 << 20), read


def test_large_body_under_the_limit_is_tokenized_off_the_event_loop(server: ThreadServer) -> None:
    # 3.6 MB: under the 4 MiB limit, so it is decoded and tokenized (hundreds of thousands of
    # tokens) before the context check refuses it; /health must answer quickly all the while
    body = json.dumps(_body(messages=[{"role": "user", "content": "lorem ipsum " * 300_000}])).encode()
    assert 3_000_000 < len(body) < 4 * 1024 * 1024

    def send() -> httpx.Response:
        return httpx.post(f"{server.url}/v1/chat/completions", content=body,
                          headers={"content-type": "application/json"}, timeout=120)

    r, latencies = _quick_under_load(server.url, send)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert len(latencies) >= 3 and max(latencies) < 0.2, (len(latencies), max(latencies))


def test_burst_fills_the_batch_before_it_queues(server: ThreadServer) -> None:
    """40 at once, 16 batch slots, --max-waiting 4: at least 16 + 4 are admitted (was 4)."""
    _wait_idle(server)

    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            body = _body(max_tokens=8, ignore_eos=True, temperature=0)
            return await asyncio.gather(*(client.post("/v1/chat/completions", json=body)
                                          for _ in range(40)))

    responses = asyncio.run(burst())
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 429}, codes
    assert codes.count(200) >= MAX_NUM_SEQS + MAX_WAITING, codes
    for r in responses:
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "rate_limit_exceeded" and int(r.headers["retry-after"]) >= 1
        else:
            assert r.json()["usage"]["completion_tokens"] == 8


def test_short_fuzz_against_the_real_engine(server: ThreadServer) -> None:
    pytest.importorskip("schemathesis")
    from tests.fuzz.runner import fuzz

    def reach_the_engine(case: Any) -> None:
        body = case.body
        if isinstance(body, dict):
            # a name past the schema's bounds (empty, or too long) stays: a negative case the
            # server must refuse
            if isinstance(body.get("model"), str) and 1 <= len(body["model"]) <= MAX_MODEL_CHARS:
                body["model"] = MODEL
            if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
                body["max_tokens"] = 4  # else the default is the rest of the context window
            for key in ("max_tokens", "max_completion_tokens"):  # keep each generation short
                if isinstance(body.get(key), int) and not isinstance(body.get(key), bool):
                    body[key] = max(1, min(body[key], 4))

    _wait_idle(server)
    report = fuzz(server.url, max_examples=8, prepare=reach_the_engine,
                  operations={"POST /v1/chat/completions", "POST /v1/completions"})
    assert report.failures == [], "\n\n".join(report.failures[:5])
    assert report.server_errors() == 0
    assert report.count("POST /v1/chat/completions", 200) > 0
