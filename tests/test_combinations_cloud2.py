"""The cloud client's field retry, the cloud-call accounting and the budget used together, against a
real HTTP cloud on loopback that behaves like a hosted API (400 "Unrecognized request argument
supplied: top_k") and then breaks off, stays silent, or answers whole; the device is WordDevice
(fast). The ledger, ``stats()`` and the answers' ``cost_usd`` / ``usage`` must agree whichever way a
request ends, and ``hybridllm serve`` tells an OpenAI client when a spent budget has room again.
The real SmolLM2 version is in e2e/test_combinations_cloud2_real.py."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM
from hybridllm.router import RoutingPolicy
from hybridllm.router.budget import Budget

from .test_combinations import CloudRouter
from .test_context_window import LONG, WordDevice
from .test_pii_restore import PROMPT, HardRouter

PRICE = 0.002  # per 1k tokens
SHORT = "hello there"  # 6 tokens for WordDevice (2 words + 4 a message)
JANE = "jane.doe@example.com"  # PROMPT's [EMAIL_1]
# what a hosted OpenAI-style API accepts; anything else is refused as unknown
KNOWN = {"model", "messages", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed",
         "stop"}


class HostedCloud(http.server.ThreadingHTTPServer):
    """Refuses unknown fields as api.openai.com does; then, by ``mode``: "break" streams ``pieces``
    and closes the connection mid-answer, "whole" streams them with a finish and ``usage``,
    "silent" reads the request and sends nothing until ``go``."""

    daemon_threads = True

    def __init__(self, pieces: list[str], mode: str = "break", usage: tuple[int, int] | None = None):
        self.pieces, self.mode, self.usage = pieces, mode, usage
        self.bodies: list[dict] = []
        self.accepted = threading.Event()
        self.go = threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def stop(self) -> None:
        self.go.set()
        self.shutdown()
        self.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _event(self, event: dict | str) -> None:
        data = event if isinstance(event, str) else json.dumps(event)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    def do_GET(self) -> None:  # /v1/models
        self._json(200, {"data": [{"id": "hosted-model"}]})

    def do_POST(self) -> None:
        srv: HostedCloud = self.server  # type: ignore[assignment]
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        srv.bodies.append(body)
        unknown = sorted(set(body) - KNOWN)
        if unknown:
            return self._json(400, {"error": {
                "message": f"Unrecognized request argument supplied: {', '.join(unknown)}",
                "type": "invalid_request_error", "param": None, "code": None}})
        srv.accepted.set()
        if srv.mode == "silent":
            srv.go.wait(30)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for piece in srv.pieces:
            self._event({"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
        if srv.mode == "whole":
            self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            if srv.usage is not None:
                p, c = srv.usage
                self._event({"choices": [], "usage": {"prompt_tokens": p, "completion_tokens": c,
                                                      "total_tokens": p + c}})
            self._event("[DONE]")
        # "break": HTTP/1.0, so returning closes the connection mid-answer


@pytest.fixture
def hosted():
    servers: list[HostedCloud] = []

    def make(pieces: list[str], mode: str = "break", usage: tuple[int, int] | None = None) -> HostedCloud:
        servers.append(HostedCloud(pieces, mode, usage))
        return servers[-1]

    yield make
    for srv in servers:
        srv.stop()


def client(cloud: HostedCloud, **kw) -> HybridLLM:
    opts = {"policy": CloudRouter(), "max_cloud_tokens_per_day": 10_000, **kw}
    return HybridLLM(edge=WordDevice(), cloud_url=cloud.url, cache=False, price_per_1k_tokens=PRICE,
                     cloud_max_retries=0, **opts)


def read(llm: HybridLLM, how: str, prompt: str) -> tuple[list[str], object]:
    if how == "chat":
        c = llm.chat(prompt)
        return [c.text], c
    if how == "stream":  # the device's part on the reading thread (the sync client's inline path)
        stream = llm.stream(prompt)
        return [ch.text for ch in stream], stream.completion

    async def run():
        async with AsyncHybridLLM.wrap(llm).stream(prompt) as s:
            texts = [ch.text async for ch in s]
        return texts, s.completion

    return asyncio.run(run())


def consistent(llm: HybridLLM) -> dict:
    """The stats' cloud tokens and cost are the ledger's."""
    s = llm.stats()
    assert s["cloud_tokens"] == s["budget"]["tokens_day"], s
    assert s["cloud_cost_usd"] == pytest.approx(s["budget"]["tokens_day"] / 1000 * PRICE, abs=1e-9)
    assert s["budget"]["calls_in_flight"] == 0
    return s


# --- a hosted endpoint that rejects top_k and then breaks mid-answer -----------------------------


@pytest.mark.parametrize("how", ["chat", "stream", "async"])
def test_the_field_retry_and_the_break_are_one_call_and_the_device_part_is_a_saving(hosted, how):
    cloud = hosted(["abcdefgh "])  # 9 characters (3 tokens: ceil(9 / 4)), then the connection drops
    llm = client(cloud)
    texts, c = read(llm, how, SHORT)
    # two POSTs (the first refused for top_k, costing nothing), one call in the budget
    assert [("top_k" in b) for b in cloud.bodies] == [True, False]
    assert c.route == "cloud->edge" and c.text == "abcdefgh device answer" == "".join(texts)
    s = consistent(llm)
    assert (s["budget"]["calls_day"], s["budget"]["tokens_day"]) == (1, 6 + 3)
    assert c.cost_usd == pytest.approx(s["cloud_cost_usd"], abs=1e-9)
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (6, 3 + 2)
    # the device wrote 2 of the answer's tokens: a cloud-only client would have paid for them
    assert s["cost_saved_vs_cloud_only_usd"] == pytest.approx(2 / 1000 * PRICE, abs=1e-9)
    llm.close()


def test_a_whole_answer_from_the_hosted_endpoint_saves_nothing(hosted):
    llm = client(hosted(["abcdefgh "], mode="whole", usage=(7, 3)))
    c = llm.chat(SHORT)
    s = consistent(llm)
    assert c.route == "cloud" and s["cloud_tokens"] == 10 and s["cost_saved_vs_cloud_only_usd"] == 0
    llm.close()


# --- requests that end without an answer: the stats count their calls as the ledger does ----------


def test_a_reader_that_stops_mid_answer_leaves_the_stats_equal_to_the_ledger(hosted):
    cloud = hosted(["abcdefgh ", "ijklmnop ", "qrstuvwx "], mode="whole", usage=(7, 6))
    llm = client(cloud)
    stream = llm.stream(SHORT)
    for _ in stream:
        break  # one chunk, then the caller hangs up
    stream.close()
    s = consistent(llm)
    assert s["requests"] == 0 and s["budget"]["calls_day"] == 1
    assert s["cloud_tokens"] >= 6 + 2  # its prompt and at least what it streamed
    llm.close()


def test_a_call_cancelled_before_its_first_token_after_the_field_retry_counts_its_prompt(hosted):
    cloud = hosted([], mode="silent")
    llm = client(cloud)

    async def run():
        task = asyncio.ensure_future(AsyncHybridLLM.wrap(llm).chat(SHORT))
        while not cloud.accepted.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    s = consistent(llm)
    assert [("top_k" in b) for b in cloud.bodies] == [True, False]
    assert (s["budget"]["calls_day"], s["cloud_tokens"]) == (1, 6)
    llm.close()


def test_a_session_of_every_ending_keeps_stats_and_ledger_equal(hosted):
    whole = hosted(["abcdefgh "], mode="whole", usage=(7, 3))
    broken = hosted(["abcdefgh "])
    llm = client(whole)
    answers = [llm.chat(SHORT)]
    stream = llm.stream(SHORT)
    next(iter(stream))
    stream.close()  # hung up
    llm.close()
    # the same session's stats and ledger on another endpoint (one client per cloud_url)
    other = client(broken)
    other._core.stats, other._core.ledger = llm._core.stats, llm._core.ledger
    answers.append(other.chat(SHORT))
    s = consistent(other)
    assert s["requests"] == 2 and s["budget"]["calls_day"] == 3
    # what the answers say they cost, plus the hung-up call's prompt (6) and streamed text (9
    # characters: 3 tokens)
    assert s["cloud_cost_usd"] == pytest.approx(sum(c.cost_usd for c in answers) + 9 / 1000 * PRICE, abs=1e-9)
    other.close()


# --- privacy="redact" with an endpoint that rejects top_k and breaks inside a placeholder ----------


@pytest.mark.parametrize("how", ["chat", "stream", "async"])
def test_redact_with_a_field_rejecting_endpoint_that_breaks_in_a_placeholder(hosted, how):
    cloud = hosted(["Sure. I will write to [EMA"])
    llm = client(cloud, policy=RoutingPolicy(HardRouter(), privacy="redact"), max_cloud_calls_per_hour=5)
    texts, c = read(llm, how, PROMPT)
    assert c.route == "cloud->edge" and "".join(texts) == c.text
    assert "EMA" not in c.text and c.text.startswith("Sure. I will write to device answer")
    assert len(cloud.bodies) == 2 and JANE not in json.dumps(cloud.bodies)
    s = consistent(llm)
    assert s["budget"]["calls_day"] == 1
    llm.close()


# --- a spent budget: when there is room again -----------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_retry_after_is_the_longest_wait_of_the_spent_limits():
    clock = Clock()
    b = Budget(max_cloud_calls_per_hour=2, max_cloud_tokens_per_day=100, clock=clock)
    b.record(60)
    clock.now += 600
    b.record(50)  # both limits spent: calls until the first leaves the hour, tokens for a day
    clock.now += 100
    assert b.exhausted() is not None
    assert b.retry_after_s() == pytest.approx(86_400 - 700)
    b2 = Budget(max_cloud_calls_per_hour=2, clock=clock)
    b2.record(1)
    clock.now += 900
    b2.record(1)
    assert b2.retry_after_s() == pytest.approx(3600 - 900)


def test_retry_after_counts_the_calls_in_flight_and_a_limit_of_zero_never_has_room():
    clock = Clock()
    b = Budget(max_cloud_calls_per_hour=1, clock=clock)
    held, _ = b.reserve(10)
    assert held is not None and b.exhausted() is not None
    assert b.retry_after_s() == pytest.approx(3600)  # it settles now and stays an hour
    b.release(held)
    assert b.retry_after_s() == 0.0
    assert Budget(max_cloud_calls_per_hour=0).retry_after_s() is None
    # a call in flight holds its most (prompt plus max_tokens), and settles with its own count:
    # the settled calls alone say when there may be room
    tokens = Budget(max_cloud_tokens_per_hour=100, clock=clock)
    tokens.record(60)
    clock.now += 100
    assert tokens.reserve(80)[0] is not None and tokens.exhausted() is not None
    assert tokens.retry_after_s() == 0.0
    tokens.record(50)  # 110 settled: room once the first 60 leave the hour
    assert tokens.retry_after_s() == pytest.approx(3600 - 100)


def _openai_error(llm: HybridLLM, body: dict):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    with TestClient(create_app(llm)) as http:
        sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="none", max_retries=0, http_client=http)
        with pytest.raises(openai.RateLimitError) as info:
            sdk.chat.completions.create(model="x", **body)
    return info.value


@pytest.mark.parametrize("forced", [False, True])
def test_the_proxy_tells_an_openai_client_when_the_budget_has_room_again(hosted, forced):
    cloud = hosted(["fine"], mode="whole", usage=(5, 1))
    clock = Clock()
    llm = HybridLLM(edge=WordDevice(), cloud_url=cloud.url, cache=False, policy=CloudRouter(),
                    max_cloud_calls_per_hour=1, cloud_max_retries=0)
    assert llm._core.ledger is not None
    llm._core.ledger.clock = clock
    assert llm.chat(SHORT).route == "cloud"  # the hour's one call, at t=1000
    clock.now += 1234.4
    # too long for the device (a retry, not a shorter prompt), or a forced cloud route
    forcing = {"extra_body": {"hybridllm": {"route": "cloud"}}}
    body = ({"messages": [{"role": "user", "content": SHORT}], **forcing} if forced
            else {"messages": [{"role": "user", "content": LONG}]})
    err = _openai_error(llm, body)
    assert err.status_code == 429 and err.code == "cloud_budget_spent"
    # the call leaves the sliding hour at t=4600: 2365.6 s from now, rounded up
    assert err.response.headers["retry-after"] == "2366"
    llm.close()
