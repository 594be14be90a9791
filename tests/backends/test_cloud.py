"""The cloud client against scripted HTTP answers (httpx.MockTransport): retries, Retry-After,
circuit breaker, balancing, errors. The real-server tests are in tests/e2e."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from hybridllm import (
    CloudAuthError,
    CloudRateLimitError,
    CloudUnavailableError,
    GenerationParams,
)
from hybridllm.backends.circuit import CircuitBreaker, Endpoint, pick_endpoint
from hybridllm.backends.cloud import CloudBackend, parse_retry_after

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=8, temperature=0)


def sse(*texts, usage=(3, 2)):
    events = [{"choices": [{"delta": {"content": t}, "finish_reason": None}]} for t in texts]
    events.append({"choices": [{"delta": {}, "finish_reason": "stop"}]})
    events.append({"choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}})
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


class Script:
    """Answers each POST with the next scripted response; records what was sent."""

    def __init__(self, *responses):
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request):
        with self.lock:
            self.requests.append(request)
            item = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(item, Exception):
            raise item
        return item


def _record(slept):
    async def sleep(seconds):
        slept.append(seconds)

    return sleep


def backend(script, **kw):
    kw.setdefault("backoff_base_s", 0.0)
    return CloudBackend(base_url=kw.pop("base_url", "http://cloud.test"), model="m",
                        transport=httpx.MockTransport(script), **kw)


def test_streams_text_and_usage():
    script = Script(sse("Hel", "lo"))
    g = backend(script).generate(MSGS, P)
    assert (g.text, g.finish_reason) == ("Hello", "stop")
    assert (g.usage.prompt_tokens, g.usage.completion_tokens) == (3, 2)
    sent = json.loads(script.requests[0].content)
    assert sent["stream"] and sent["stream_options"] == {"include_usage": True}
    assert script.requests[0].url.path == "/v1/chat/completions"


def test_retries_dropped_connections_and_5xx_then_succeeds():
    script = Script(httpx.RemoteProtocolError("server disconnected"), httpx.Response(503, json={}),
                    sse("ok"))
    assert backend(script, max_retries=3).generate(MSGS, P).text == "ok"
    assert len(script.requests) == 3


def test_429_honours_retry_after(monkeypatch):
    slept = []
    monkeypatch.setattr("hybridllm.backends.cloud_retry._sleep", _record(slept))
    script = Script(httpx.Response(429, headers={"Retry-After": "2"}, json={}), sse("ok"))
    assert backend(script).generate(MSGS, P).text == "ok"
    assert slept == [2.0]


def test_429_burst_exhausts_retries_with_rate_limit_error(monkeypatch):
    monkeypatch.setattr("hybridllm.backends.cloud_retry._sleep", _record([]))
    script = Script(httpx.Response(429, headers={"Retry-After": "1"}, json={}))
    with pytest.raises(CloudRateLimitError):
        backend(script, max_retries=2, breaker_threshold=10).generate(MSGS, P)
    assert len(script.requests) == 3


def test_auth_error_is_not_retried_and_key_is_never_shown():
    script = Script(httpx.Response(401, json={"error": {"message": "bad key"}}))
    b = backend(script, api_key="sk-secret-123")
    with pytest.raises(CloudAuthError) as err:
        b.generate(MSGS, P)
    assert len(script.requests) == 1
    assert "sk-secret-123" not in str(err.value) and "sk-secret-123" not in repr(b)
    assert script.requests[0].headers["authorization"] == "Bearer sk-secret-123"


def test_breaker_opens_then_fails_fast_then_half_open_probe_recovers():
    now = [0.0]
    script = Script(httpx.ReadTimeout("slow"))  # a failure that counts (a refused connection trips at once)
    b = backend(script, max_retries=0, breaker_threshold=2, breaker_cooldown_s=5)
    b.endpoints[0].breaker._clock = lambda: now[0]
    for _ in range(2):
        with pytest.raises(CloudUnavailableError):
            b.generate(MSGS, P)
    assert b.endpoints[0].breaker.state == "open" and not b.is_available()
    calls = len(script.requests)
    with pytest.raises(CloudUnavailableError, match="circuit open"):
        b.generate(MSGS, P)
    assert len(script.requests) == calls  # failed fast, nothing sent
    now[0] = 6.0  # cooldown over: one probe goes through
    script.responses = [sse("back")]
    assert b.is_available()
    assert b.generate(MSGS, P).text == "back"
    assert b.endpoints[0].breaker.state == "closed"


def test_failed_probe_reopens():
    now = [0.0]
    br = CircuitBreaker(threshold=1, cooldown_s=1, clock=lambda: now[0])
    br.record_failure()
    now[0] = 2
    assert br.allow() and not br.allow()  # a single probe
    br.record_failure()
    assert br.state == "open"


def test_balancing_prefers_fewest_outstanding_tokens():
    a = Endpoint("http://a", CircuitBreaker())
    b = Endpoint("http://b", CircuitBreaker())
    a.add(1000)  # one long request
    b.add(10)
    b.add(10)
    b.add(10)  # three short ones
    assert pick_endpoint([a, b], set()) is b


def test_retry_moves_to_another_endpoint():
    seen = []

    def handler(request):
        seen.append(request.url.host)
        if request.url.host == "a.test":
            raise httpx.ConnectError("down")
        return sse("from b")

    b = CloudBackend(base_url=["http://a.test", "http://b.test"], model="m", backoff_base_s=0,
                     transport=httpx.MockTransport(handler))
    b.endpoints[1].add(50)  # make a the first pick
    assert b.generate(MSGS, P).text == "from b"
    assert seen[0] == "a.test" and seen[-1] == "b.test"


def test_model_discovered_from_v1_models():
    def handler(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "served-model"}]})
        assert json.loads(request.content)["model"] == "served-model"
        return sse("x")

    b = CloudBackend(base_url="http://c.test/v1", transport=httpx.MockTransport(handler))
    assert b.generate(MSGS, P).text == "x" and b.model == "served-model"


def test_parse_retry_after():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


def test_a_stream_cut_off_mid_answer_is_an_error_not_a_short_answer():
    events = [{"choices": [{"delta": {"content": t}, "finish_reason": None}]} for t in ("Hel", "lo")]
    cut = httpx.Response(200, text="".join(f"data: {json.dumps(e)}\n\n" for e in events),
                         headers={"content-type": "text/event-stream"})  # no finish, no [DONE]
    pieces = []
    with pytest.raises(CloudUnavailableError, match="broke off.*ended before the answer"):
        for delta in backend(Script(cut), max_retries=2).stream(MSGS, P):
            pieces.append(delta.text)
    assert pieces == ["Hel", "lo"]  # what was streamed stays; nothing is retried or duplicated
    # a cut before the first token is retried like any other failure
    g = backend(Script(httpx.Response(200, text=""), sse("ok")), max_retries=1).generate(MSGS, P)
    assert g.text == "ok"


def test_a_refused_key_while_listing_models_is_an_auth_error_sent_once():
    """Before: GET /models answering 401 was retried as 'cloud unavailable' (issue 19, item 5)."""
    seen = []

    def handler(request):
        seen.append(request.url.path)
        return httpx.Response(401, json={"error": {"message": "invalid key"}})

    b = CloudBackend(base_url="http://c.test", api_key="sk-wrong", max_retries=3,
                     backoff_base_s=0, transport=httpx.MockTransport(handler))
    with pytest.raises(CloudAuthError, match="refused the API key"):
        b.generate(MSGS, P)
    assert seen == ["/v1/models"] and b.endpoints[0].breaker.state == "closed"


def test_every_sampling_setting_reaches_the_cloud():
    script = Script(sse("ok"))
    params = GenerationParams(max_tokens=8, temperature=0.5, top_k=7, min_p=0.1,
                              repeat_penalty=1.3, seed=5)
    backend(script).generate(MSGS, params)
    sent = json.loads(script.requests[0].content)
    assert (sent["top_k"], sent["min_p"], sent["repetition_penalty"], sent["seed"]) == (7, 0.1, 1.3, 5)
    script = Script(sse("ok"))
    backend(script).generate(MSGS, P)  # filters that are off are not sent
    assert "min_p" not in json.loads(script.requests[0].content)


class _Stalling(httpx.AsyncByteStream):
    """Two tokens, then silence (a hung server that keeps the connection open)."""

    async def __aiter__(self):
        import asyncio

        for t in ("Hel", "lo"):
            yield f"data: {json.dumps({'choices': [{'delta': {'content': t}}]})}\n\n".encode()
        await asyncio.sleep(30)


def test_a_stream_that_stalls_after_its_first_token_breaks_off_within_the_stall_timeout():
    import time

    transport = httpx.MockTransport(lambda r: httpx.Response(200, stream=_Stalling()))
    b = CloudBackend(base_url="http://c.test", model="m", read_timeout_s=60, stall_timeout_s=0.3,
                     transport=transport)
    pieces, t0 = [], time.perf_counter()
    with pytest.raises(CloudUnavailableError, match="stalled: no event for 0.3 s"):
        for delta in b.stream(MSGS, P):
            pieces.append(delta.text)
    assert pieces == ["Hel", "lo"] and time.perf_counter() - t0 < 5


@pytest.mark.parametrize("event", [
    {"choices": [{"delta": "oops"}]},
    {"choices": ["oops"]},
    {"choices": {"a": 1}},
    {"choices": [{"delta": {"content": 5}}]},
    # (a count of the wrong shape is ignored, the answer kept: test_cloud_wire_review14.py)
    [1, 2],
])
def test_an_event_of_the_wrong_shape_is_a_cloud_failure_not_a_crash(event):
    """Before: AttributeError / TypeError / ValueError from the parser reached the caller, so
    HybridLLM neither fell back to the device nor said what was wrong."""
    body = f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n"
    script = Script(httpx.Response(200, text=body, headers={"content-type": "text/event-stream"}))
    with pytest.raises(CloudUnavailableError, match="malformed event"):
        backend(script, max_retries=0).generate(MSGS, P)


def test_a_garbage_cloud_answer_falls_back_to_the_device():
    from hybridllm import HybridLLM
    from hybridllm.backends.fake import FakeBackend

    body = 'data: {"choices": [{"delta": "oops"}]}\n\ndata: [DONE]\n\n'
    cloud = backend(Script(httpx.Response(200, text=body)), max_retries=0)
    with HybridLLM(edge=FakeBackend(reply=lambda m: "from the device"), cloud=cloud, cache=False) as llm:
        c = llm.chat("hi", route="cloud")
    assert (c.text, c.route) == ("from the device", "edge (cloud unavailable)")


def test_a_stream_broken_off_mid_answer_closes_its_line_reader_at_once(monkeypatch):
    """Before: the reader was left to the garbage collector, whose clean-up task could outlive the
    client's loop and print 'Task was destroyed but it is pending!' on stderr."""
    import asyncio

    closed = []
    # the client splits lines itself (cloud_stream._lines: a line has a size bound), over aiter_text
    texts = httpx.Response.aiter_text

    async def tracked(self, *args):
        try:
            async for text in texts(self, *args):
                yield text
        finally:
            closed.append(True)

    monkeypatch.setattr(httpx.Response, "aiter_text", tracked)
    body = 'data: {"choices": [{"delta": {"content": "hi"}}]}\n\ndata: garbage{\n\n'
    cloud = backend(Script(httpx.Response(200, text=body)), max_retries=0)

    async def read() -> list:
        with pytest.raises(CloudUnavailableError, match="broke off"):
            async for _ in cloud.astream(MSGS, P):
                pass
        return list(closed)  # before any task scheduled by a finalizer could run

    assert asyncio.run(read()) == [True]


def test_an_unexpected_status_names_the_url_that_gave_it():
    """Before: 'The cloud answered HTTP 404: nope', with no word of which endpoint (of several)."""
    from hybridllm import CloudError

    cloud = CloudBackend(base_url="http://cloud.test/notapi", transport=httpx.MockTransport(
        lambda request: httpx.Response(404, text="nope")))
    with pytest.raises(CloudError, match=r"http://cloud.test/notapi/v1/models answered HTTP 404"):
        cloud.generate(MSGS, P)
