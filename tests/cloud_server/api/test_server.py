"""The HTTP API against a fake engine on a real uvicorn server (fast: no model)."""

from __future__ import annotations

import concurrent.futures
import logging
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from cloud_server.api.server import create_app
from cloud_server.exceptions import EngineError

from .fake_engine import REPLY, FakeEngine
from .helpers import ThreadServer, metric_value, sse_payloads

KEY = "sk-test-key"
OTHER_KEY = "sk-second-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MSGS = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def engine() -> FakeEngine:
    return FakeEngine(max_num_seqs=4, max_waiting=8, max_model_len=512)


@pytest.fixture(scope="module")
def server(engine: FakeEngine) -> Iterator[ThreadServer]:
    app = create_app(lambda: engine, api_keys=[KEY, OTHER_KEY])
    srv = ThreadServer(app).start()
    yield srv
    srv.stop()


@pytest.fixture()
def client(server: ThreadServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        yield c


def wait_pool_free(engine: FakeEngine, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine.num_free_blocks == engine.num_total_blocks and not engine.live:
            return
        time.sleep(0.01)
    raise AssertionError(f"blocks not freed: {engine.stats()} live={engine.live}")


def chat(client: httpx.Client, **body: object) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"model": "fake-model", "messages": MSGS, **body})


def test_chat_completion(client: httpx.Client) -> None:
    r = chat(client, temperature=0)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": REPLY}
    assert body["choices"][0]["finish_reason"] == "stop"
    prompt_len = len("<user>Hi\n<assistant>")
    assert body["usage"]["prompt_tokens"] == prompt_len
    assert body["usage"]["completion_tokens"] == len(REPLY)
    assert body["usage"]["total_tokens"] == prompt_len + len(REPLY)


def test_max_tokens_gives_length(client: httpx.Client) -> None:
    body = chat(client, max_tokens=5).json()
    assert body["choices"][0]["message"]["content"] == REPLY[:5]
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5
    assert chat(client, max_completion_tokens=3).json()["usage"]["completion_tokens"] == 3


def test_chat_stream_matches_and_ends_with_done(client: httpx.Client) -> None:
    req = {"model": "fake-model", "messages": MSGS, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=req) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_payloads(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "usage" not in chunks[0]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == REPLY
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"


def test_stream_include_usage(client: httpx.Client) -> None:
    req = {
        "model": "fake-model",
        "messages": MSGS,
        "stream": True,
        "max_tokens": 4,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", "/v1/chat/completions", json=req) as r:
        events = sse_payloads(r.iter_lines())
    assert events[-1] == "[DONE]"
    *chunks, usage_chunk = events[:-1]
    assert all(c["usage"] is None for c in chunks)
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 4
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_legacy_completion(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": "fake-model", "prompt": "abc", "max_tokens": 6})
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == REPLY[:6]
    assert body["usage"]["prompt_tokens"] == 3
    r = client.post("/v1/completions", json={"model": "fake-model", "prompt": [97, 98]})
    usage = r.json()["usage"]
    energy = usage.pop("energy")  # cloud_server.energy: measured or estimated, always labelled
    assert energy["source"] in ("nvml", "rapl", "estimate") and energy["joules"] >= 0
    assert usage == {
        "prompt_tokens": 2,
        "completion_tokens": 16,
        "total_tokens": 18,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_legacy_completion_stream(client: httpx.Client) -> None:
    req = {"model": "fake-model", "prompt": ["abc"], "max_tokens": 7, "stream": True}
    with client.stream("POST", "/v1/completions", json=req) as r:
        events = sse_payloads(r.iter_lines())
    assert events[-1] == "[DONE]"
    assert "".join(c["choices"][0]["text"] for c in events[:-1]) == REPLY[:7]
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_models(client: httpx.Client) -> None:
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["fake-model"]
    assert client.get("/v1/models/fake-model").status_code == 200
    assert client.get("/v1/models/other").status_code == 404


def test_second_key_accepted(server: ThreadServer) -> None:
    headers = {"Authorization": f"bearer {OTHER_KEY}"}
    assert httpx.get(f"{server.url}/v1/models", headers=headers).status_code == 200


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer wrong"}, 401), ({"Authorization": KEY}, 401)],
)
def test_auth_errors(server: ThreadServer, headers: dict[str, str], status: int) -> None:
    r = httpx.post(f"{server.url}/v1/chat/completions", headers=headers, content=b"{not json")
    assert r.status_code == status
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_health_and_metrics_are_open(server: ThreadServer) -> None:
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/metrics").status_code == 200


@pytest.mark.parametrize(
    ("content", "param", "fragment"),
    [
        (b"{not json", None, "JSON"),
        (b"[1, 2]", None, "JSON object"),
        (b'{"model": "fake-model"}', "messages", "Missing"),
        (b'{"model": "fake-model", "messages": [], "bogus": 1}', "bogus", "Unrecognized"),
        (b'{"model": "fake-model", "messages": "hi"}', "messages", "Invalid"),
        (
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "temperature": 3}',
            "temperature",
            "Invalid",
        ),
        (
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}',
            "max_tokens",
            "Invalid",
        ),
        (
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
            "max_tokens",
            "Invalid",
        ),
        (
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "n": 129}',
            "n",
            "<= 128",
        ),
        (
            b'{"model": "fake-model", "messages": [{"role": "wizard", "content": "x"}]}',
            "messages[0].role",
            "Invalid",
        ),
        (b"\xff\xfe", None, "JSON"),
        (b"[" * 100_000, None, "JSON"),
        (
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], '
            b'"stream_options": {"include_usage": true}}',
            "stream_options",
            "stream",
        ),
    ],
)
def test_invalid_requests(client: httpx.Client, content: bytes, param: str | None, fragment: str) -> None:
    r = client.post("/v1/chat/completions", content=content)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert fragment in error["message"]


def test_context_length_errors(client: httpx.Client) -> None:
    r = chat(client, max_tokens=10_000)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "max_tokens"
    r = client.post("/v1/completions", json={"model": "fake-model", "prompt": "x" * 600})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    # the prompt alone is too long: naming max_tokens would send a client after the wrong field
    assert r.json()["error"]["param"] == "prompt"
    r = client.post("/v1/completions", json={"model": "fake-model", "prompt": "x" * 400, "max_tokens": 200})
    assert r.json()["error"]["param"] == "max_tokens"
    r = chat(client, messages=[{"role": "user", "content": "x" * 600}], max_tokens=1)
    assert r.json()["error"]["param"] == "messages"


def test_unknown_model_and_route(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json={"model": "gpt-9", "messages": MSGS})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    r = client.post("/v1/nothing", json={})
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_queue_full_gives_429_with_retry_after(server: ThreadServer, engine: FakeEngine) -> None:
    def one(i: int) -> httpx.Response:
        body = {"model": "fake-model", "messages": MSGS, "max_tokens": 60, "ignore_eos": True}
        return httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=30)

    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        responses = list(pool.map(one, range(24)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) >= engine.max_num_seqs + engine.max_waiting - 2
    limited = [r for r in responses if r.status_code == 429]
    assert limited, statuses
    assert limited[0].headers["Retry-After"] == "2"
    assert limited[0].json()["error"]["type"] == "requests"
    assert limited[0].json()["error"]["code"] == "rate_limit_exceeded"
    wait_pool_free(engine)


def test_refused_requests_take_no_share_of_the_energy(server: ThreadServer, engine: FakeEngine) -> None:
    """A 429 must not stay on the energy meter's books: every later request's energy would be
    divided among it and the refused ones, for the life of the server."""
    meter = server.server.config.app.state.metrics.energy.meter
    assert meter is not None

    def one(i: int) -> int:
        body = {"model": "fake-model", "messages": MSGS, "max_tokens": 60, "ignore_eos": True}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
        return r.status_code

    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        statuses = list(pool.map(one, range(24)))
    assert 429 in statuses and 200 in statuses, statuses
    wait_pool_free(engine)
    assert meter._active == {}  # every admitted request ended, so nobody shares the power now


def test_disconnect_mid_stream_aborts_and_frees_blocks(server: ThreadServer, engine: FakeEngine) -> None:
    wait_pool_free(engine)
    req = {
        "model": "fake-model",
        "messages": MSGS,
        "stream": True,
        "max_tokens": 400,
        "ignore_eos": True,
    }
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        with c.stream("POST", "/v1/chat/completions", json=req) as r:
            lines = r.iter_lines()
            for _ in range(6):
                next(lines)
            assert engine.num_running == 1
            assert engine.num_free_blocks < engine.num_total_blocks
    wait_pool_free(engine)
    assert engine.num_running == 0


def test_disconnect_while_queued_or_unstreamed_aborts(server: ThreadServer, engine: FakeEngine) -> None:
    wait_pool_free(engine)
    body = {"model": "fake-model", "messages": MSGS, "max_tokens": 400, "ignore_eos": True}
    stop = threading.Event()

    def hold() -> None:  # non-streaming requests that the client gives up on
        try:
            httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=0.3)
        except httpx.TimeoutException:
            pass
        stop.set()

    threads = [threading.Thread(target=hold) for _ in range(engine.max_num_seqs + 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wait_pool_free(engine)
    assert engine.num_waiting == 0


def test_client_that_hangs_up_mid_body_is_no_server_error(
    server: ThreadServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A dropped upload is the client's doing: no 500 in /metrics, no error in the log."""

    def count_500() -> float:
        text = httpx.get(f"{server.url}/metrics").text
        return metric_value(text, "hybridllm_requests_rejected_total", status="500") or 0.0

    before = count_500()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n"
    )
    with caplog.at_level(logging.ERROR, logger="cloud_server"):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(head.encode() + b'{"model": "fake-model", "messages": [')
            time.sleep(0.2)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and count_500() == before:
            time.sleep(0.05)
    assert count_500() == before
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_metrics_after_traffic(client: httpx.Client, server: ThreadServer) -> None:
    """Counters move by what this test does (deltas), so it passes alone and in any order."""
    labels = {"model": "fake-model"}

    def sample() -> dict[str, float]:
        text = httpx.get(f"{server.url}/metrics").text
        names = ["hybridllm_time_to_first_token_seconds_count", "hybridllm_e2e_request_latency_seconds_count",
                 "hybridllm_inter_token_latency_seconds_count", "hybridllm_generation_tokens_total",
                 "hybridllm_prompt_tokens_total", "hybridllm_prefix_cache_queries_total",
                 "hybridllm_prefix_cache_hits_total"]
        out = {n: metric_value(text, n, **labels) or 0.0 for n in names}
        rejected = metric_value(text, "hybridllm_requests_rejected_total", status="400", **labels)
        out["rejected_400"] = rejected or 0.0
        return out

    before = sample()
    msgs = [{"role": "user", "content": f"metrics {time.monotonic_ns()}"}]  # new to this server
    for _ in range(2):  # the same prompt twice: the second is a prefix-cache hit
        assert chat(client, max_tokens=8, messages=msgs).status_code == 200
    assert chat(client, max_tokens=0).status_code == 400
    after = sample()
    delta = {k: after[k] - before[k] for k in after}
    assert delta["hybridllm_time_to_first_token_seconds_count"] == 2
    assert delta["hybridllm_e2e_request_latency_seconds_count"] == 2
    assert delta["hybridllm_inter_token_latency_seconds_count"] == 2 * 7
    assert delta["hybridllm_generation_tokens_total"] == 16
    prompt_len = len(f"<user>{msgs[0]['content']}\n<assistant>")
    assert delta["hybridllm_prompt_tokens_total"] == 2 * prompt_len
    assert delta["hybridllm_prefix_cache_queries_total"] == 2 * prompt_len
    assert delta["hybridllm_prefix_cache_hits_total"] == prompt_len  # the repeat, whole
    assert delta["rejected_400"] == 1
    text = httpx.get(f"{server.url}/metrics").text
    assert metric_value(text, "hybridllm_num_requests_running", **labels) == 0


def test_503_until_loaded_then_200() -> None:
    gate = threading.Event()
    engine = FakeEngine()

    def slow_factory() -> FakeEngine:
        gate.wait(10)
        return engine

    srv = ThreadServer(create_app(slow_factory)).start(wait_healthy=False)
    try:
        r = httpx.get(f"{srv.url}/health")
        assert r.status_code == 503
        r = httpx.post(f"{srv.url}/v1/chat/completions", json={"model": "x", "messages": MSGS})
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "server_error"
        assert httpx.get(f"{srv.url}/metrics").status_code == 200
        gate.set()
        deadline = time.monotonic() + 5
        while httpx.get(f"{srv.url}/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            json={"model": "fake-model", "messages": MSGS, "max_tokens": 2},
        )
        assert r.status_code == 200
    finally:
        gate.set()
        srv.stop()


def test_load_failure_reported() -> None:
    failures: list[BaseException] = []

    def broken() -> FakeEngine:
        raise RuntimeError("weights are corrupt")

    srv = ThreadServer(create_app(broken, on_load_error=failures.append)).start(wait_healthy=False)
    try:
        deadline = time.monotonic() + 5
        while not failures:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = httpx.get(f"{srv.url}/health")
        assert r.status_code == 503 and r.json()["status"] == "error"
    finally:
        srv.stop()


def test_default_system_prompt_only_when_the_request_has_none() -> None:
    engine = FakeEngine(max_num_seqs=2, max_waiting=4, max_model_len=512)
    srv = ThreadServer(create_app(lambda: engine, system_prompt="Be brief.")).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            plain = c.post("/v1/chat/completions", json={"model": "fake-model", "messages": MSGS})
            own = [{"role": "developer", "content": "Mine."}, *MSGS]
            given = c.post("/v1/chat/completions", json={"model": "fake-model", "messages": own})
        assert plain.json()["usage"]["prompt_tokens"] == len("<system>Be brief.\n<user>Hi\n<assistant>")
        assert given.json()["usage"]["prompt_tokens"] == len("<system>Mine.\n<user>Hi\n<assistant>")
    finally:
        srv.stop()


def test_fake_engine_validates_at_the_call_like_the_real_one() -> None:
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.exceptions import ContextLengthError, QueueFullError

    engine = FakeEngine(max_num_seqs=1, max_waiting=1, max_model_len=16)
    with pytest.raises(ContextLengthError):  # raised by the call, before any iteration
        engine.generate("r1", "x" * 20, SamplingParams(max_tokens=1))
    engine.num_waiting = 2  # one more than the free slot plus the one that may wait
    with pytest.raises(QueueFullError):
        engine.generate("r2", "x", SamplingParams(max_tokens=1))


class _BreaksMidStream(FakeEngine):
    """Fails after two tokens with an error whose text is internal (and quotes the prompt)."""

    def generate(self, request_id, prompt, params, on_scheduled=None):  # type: ignore[no-untyped-def]
        inner = super().generate(request_id, prompt, params, on_scheduled)
        text = self.tokenizer.decode(list(prompt)) if not isinstance(prompt, str) else prompt

        async def broken():  # type: ignore[no-untyped-def]
            n = 0
            async for out in inner:
                yield out
                n += 1
                if n == 2:
                    raise EngineError(f"model step failed at /srv/secret/runner.py: {text}")

        return broken()


def test_engine_failure_mid_stream_carries_no_internal_text_and_logs_no_prompt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = _BreaksMidStream(max_model_len=512)
    srv = ThreadServer(create_app(lambda: engine)).start()
    secret = "my private question"
    try:
        with caplog.at_level("INFO"):
            body = {"model": "fake-model", "messages": [{"role": "user", "content": secret}],
                    "stream": True, "max_tokens": 20}
            r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=30)
            events = sse_payloads(iter(r.text.splitlines()))
            plain = httpx.post(f"{srv.url}/v1/chat/completions",
                               json={**body, "stream": False}, timeout=30)
    finally:
        srv.stop()
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["type"] == "server_error" and "secret" not in r.text and secret not in r.text
    assert plain.status_code == 500 and "secret" not in plain.text
    assert secret not in caplog.text and "/srv/secret" not in caplog.text
    assert "EngineError" in caplog.text  # the failure is logged, by type


def test_chat_requests_get_the_prompt_formats_stops_beside_their_own():
    # a base model's transcript format stops at the next user turn on the cloud as on the device
    from cloud_server.api.metrics import ServerMetrics
    from cloud_server.api.serving import OpenAIServing
    from hybridllm.wire import ChatCompletionRequest, CompletionRequest

    engine = FakeEngine()
    serving = OpenAIServing(engine, "fake-model", ServerMetrics(lambda: None, lambda: "fake-model"))
    chat = ChatCompletionRequest.model_validate(
        {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stop": ["END"]}
    )
    assert serving.prepare(chat).params.stop == ["END", "\n<user>"]
    plain = CompletionRequest.model_validate({"model": "fake-model", "prompt": "hi", "stop": "END"})
    assert serving.prepare(plain).params.stop == ["END"]  # a raw completion has no turns
