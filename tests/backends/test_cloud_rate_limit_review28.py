"""Review 28: the cloud client's rate limits (httpx.MockTransport, no network).

- A 429 is no failure of the endpoint's circuit: before, three 429s opened it like three 5xx, so a
  request's 4th attempt (max_retries=3) was never made, the error was CloudUnavailableError "circuit
  open after: HTTP 429" (the proxy's 503, not 429 cloud_rate_limited), the endpoint was held back
  for the circuit's cooldown (5-10 s) whatever its Retry-After said, and each probe answered 429
  doubled that, up to 5 minutes.
- A retry that waited out its own Retry-After still waits out a later one another request was
  given meanwhile: before, it asked the endpoint at once.
- A Retry-After is kept on the clock that counts a laptop's sleep (awake_clock), as the circuit and
  the budget are.
- Kept as it was (checked): a success of a request sent before a 429 does not end that 429's
  Retry-After; no request is sent to an endpoint while it lasts, so no later success can come.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from hybridllm import CloudRateLimitError
from hybridllm.backends.cloud import CloudBackend
from tests.backends.test_cloud_circuit_review15b import MSGS, P, sse


@pytest.fixture
def slept(monkeypatch):
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr("hybridllm.backends.cloud_retry._sleep", sleep)
    return waits


def _answers(*responses):
    """A handler answering the n-th request with the n-th response (the last one after that)."""
    sent: list[httpx.Request] = []

    def handler(request):
        sent.append(request)
        r = responses[min(len(sent), len(responses)) - 1]
        return r() if callable(r) else r

    return handler, sent


def _429(after: str | None = None):
    return lambda: httpx.Response(429, json={"error": {"message": "slow down"}},
                                  headers={"retry-after": after} if after is not None else {})


def test_three_429s_in_a_row_do_not_open_the_circuit_nor_cut_the_retries_short(slept):
    handler, sent = _answers(_429("0"), _429("0"), _429("0"), lambda: sse("ok"))
    cloud = CloudBackend(base_url="http://a.test", model="m", max_retries=3,
                         transport=httpx.MockTransport(handler))
    assert cloud.generate(MSGS, P).text == "ok"
    assert len(sent) == 4
    assert cloud.endpoints[0].breaker.state == "closed"


def test_429s_across_requests_leave_the_circuit_closed_and_the_endpoint_asked(slept):
    """Three requests each answered 429 without Retry-After (max_retries=0): each a rate limit, and
    the fourth is sent (before: the circuit was open and it was not)."""
    handler, sent = _answers(_429(), _429(), _429(), lambda: sse("ok"))
    cloud = CloudBackend(base_url="http://a.test", model="m", max_retries=0,
                         transport=httpx.MockTransport(handler))
    for _ in range(3):
        with pytest.raises(CloudRateLimitError):
            cloud.generate(MSGS, P)
    assert cloud.is_available() and cloud.retry_after_s() == 0.0
    assert cloud.generate(MSGS, P).text == "ok" and len(sent) == 4


def test_a_5xx_still_counts_and_a_429_between_does_not_reset_it(slept):
    handler, _ = _answers(lambda: httpx.Response(503, json={}), _429("0"),
                          lambda: httpx.Response(503, json={}))
    cloud = CloudBackend(base_url="http://a.test", model="m", max_retries=0, breaker_threshold=2,
                         transport=httpx.MockTransport(handler))
    for _ in range(3):
        with pytest.raises(Exception):  # noqa: B017 - unavailable, rate-limited, unavailable
            cloud.generate(MSGS, P)
    assert cloud.endpoints[0].breaker.state == "open"


def test_a_probe_answered_429_is_no_failed_probe(slept):
    """The circuit opened on a dead connection; its probe is answered 429 with a long Retry-After:
    the endpoint is up and rate-limiting. Before, the probe counted as failed (the cooldown doubled)
    and the circuit opened again; now the Retry-After alone holds it back, and the request is a
    rate limit."""
    now = [0.0]
    handler, sent = _answers(_429("60"))
    cloud = CloudBackend(base_url="http://a.test", model="m", breaker_cooldown_s=10,
                         transport=httpx.MockTransport(handler))
    br = cloud.endpoints[0].breaker
    br._clock, br._rng = (lambda: now[0]), (lambda: 0.0)
    br.trip()
    now[0] = 11.0  # the cooldown is over: the next request is the probe
    with pytest.raises(CloudRateLimitError) as err:
        cloud.generate(MSGS, P)
    assert len(sent) == 1 and err.value.status_code == 429
    assert br.cooldown_s == 10 and br.state == "half-open" and br.would_allow()
    assert not cloud.is_available() and cloud.rate_limited()
    assert 55 < cloud.retry_after_s() <= 60


def test_a_retry_waits_out_a_retry_after_another_request_was_given_while_it_waited():
    """A is answered 429 with 200 ms to wait; B, sent before that, is answered 429 with 600 ms while
    A waits. A's retry waits for B's too (before: it was sent at the end of its own 200 ms)."""
    t0 = time.monotonic()
    at: list[float] = []

    async def handler(request):
        at.append(time.monotonic() - t0)
        n = len(at)
        if n == 1:
            await asyncio.sleep(0.1)
            return httpx.Response(429, headers={"retry-after-ms": "200"}, json={})
        if n == 2:
            await asyncio.sleep(0.15)
            return httpx.Response(429, headers={"retry-after-ms": "600"}, json={})
        return sse("ok")

    cloud = CloudBackend(base_url="http://a.test", model="m", max_retries=3,
                         transport=httpx.MockTransport(handler))

    async def one():
        return "".join([d.text async for d in cloud.astream(MSGS, P)])

    async def main():
        nonlocal t0
        t0 = time.monotonic()
        a = asyncio.ensure_future(one())
        await asyncio.sleep(0.01)
        return await asyncio.gather(a, one())

    assert asyncio.run(main()) == ["ok", "ok"]
    # B's 429 came at about 0.16 s and asked for 0.6 s more: nothing is sent before about 0.76 s
    assert len(at) == 4 and min(at[2:]) >= 0.7, at


def test_a_success_sent_before_a_429_does_not_end_its_retry_after():
    """A is in flight when B is answered 429 with a minute to wait; A's answer then comes. The
    minute still holds: A was let in before the limit, so its success says nothing of it."""
    gate: list[asyncio.Future] = []
    sent: list[int] = []

    async def handler(request):
        sent.append(1)
        if len(sent) == 1:
            gate.append(asyncio.get_running_loop().create_future())
            await gate[0]
            return sse("ok")
        return httpx.Response(429, headers={"retry-after": "60"}, json={})

    cloud = CloudBackend(base_url="http://a.test", model="m", max_retries=3,
                         transport=httpx.MockTransport(handler))

    async def one():
        return "".join([d.text async for d in cloud.astream(MSGS, P)])

    async def main():
        a = asyncio.ensure_future(one())
        while not gate:
            await asyncio.sleep(0.001)
        with pytest.raises(CloudRateLimitError):
            await one()
        gate[0].set_result(None)
        assert await a == "ok"
        with pytest.raises(CloudRateLimitError, match="asked to wait"):
            await one()

    asyncio.run(main())
    assert len(sent) == 2
    assert cloud.endpoints[0].breaker.state == "closed" and cloud.rate_limited()


def test_a_retry_after_ends_when_its_time_has_passed_during_a_sleep(slept, monkeypatch):
    """awake_clock, not time.monotonic (which stops while a laptop sleeps): 5 minutes asked before
    an hour's sleep are over on waking."""
    now = [1000.0]
    monkeypatch.setattr("hybridllm.backends.cloud_retry.awake_clock", lambda: now[0])
    handler, sent = _answers(_429("300"), lambda: sse("ok"))
    cloud = CloudBackend(base_url="http://a.test", model="m", max_retries=0,
                         transport=httpx.MockTransport(handler))
    with pytest.raises(CloudRateLimitError):
        cloud.generate(MSGS, P)
    assert not cloud.is_available() and cloud.retry_after_s() == 300
    now[0] += 3600  # the machine slept an hour (time.monotonic would not have moved)
    assert cloud.is_available() and cloud.retry_after_s() == 0.0
    assert cloud.generate(MSGS, P).text == "ok" and len(sent) == 2


def test_a_forced_cloud_route_refused_by_the_budget_says_when_it_has_room():
    """Before: ForcedCloudOverBudgetError (a CloudBudgetSpentError) had retry_after_s None, while
    every other spent budget's error says when there is room again."""
    from hybridllm import CloudBudgetSpentError, HybridLLM
    from hybridllm.backends.fake import FakeBackend

    now = [0.0]
    with HybridLLM(edge=FakeBackend(reply=lambda m: "device"), cloud=FakeBackend(reply=lambda m: "cloud"),
                   cache=False, max_cloud_calls_per_hour=1) as llm:
        llm._core.budget_binds_forced_cloud = True  # as `hybridllm serve` sets it
        llm._core.ledger.clock = lambda: now[0]
        assert llm.chat("hi", route="cloud").route == "cloud"
        now[0] = 600.0
        with pytest.raises(CloudBudgetSpentError) as err:
            llm.chat("hi", route="cloud")
    assert err.value.retry_after_s == pytest.approx(3000.0)
    assert "budget spent" in err.value.reason


def test_a_forced_cloud_route_under_a_limit_of_0_never_has_room():
    from hybridllm import CloudBudgetSpentError, HybridLLM
    from hybridllm.backends.fake import FakeBackend

    with HybridLLM(edge=FakeBackend(reply=lambda m: "device"), cloud=FakeBackend(reply=lambda m: "cloud"),
                   cache=False, max_cloud_calls_per_hour=0) as llm:
        llm._core.budget_binds_forced_cloud = True
        with pytest.raises(CloudBudgetSpentError) as err:
            llm.chat("hi", route="cloud")
    assert err.value.retry_after_s is None


def test_a_long_prompt_after_a_burst_of_429s_is_a_rate_limit_not_an_outage(slept):
    """Before: the first long prompt's three 429s opened the circuit, so the next long prompt was
    "the cloud is unavailable (circuit open after: HTTP 429 ...)": CloudUnavailableError, the
    proxy's 503, and the cloud not asked though its Retry-After (0 s) was long over."""
    from tests.test_context_window import LONG, client

    handler, sent = _answers(_429("0"))
    cloud = CloudBackend(base_url="http://a.test", model="m", max_retries=2,
                         transport=httpx.MockTransport(handler))
    llm, edge = client(cloud)
    with llm:
        for n in (3, 6):
            with pytest.raises(CloudRateLimitError) as err:
                llm.chat(LONG)
            assert err.value.status_code == 429 and "rate-limiting" in str(err.value), err.value
            assert len(sent) == n
    assert edge.generated == 0


def test_going_back_to_a_failed_endpoint_after_a_long_retry_after_still_waits_its_backoff(monkeypatch):
    """a answers 503, b 429 with a minute to wait (not waited for). Before, a was asked again at
    once, its backoff skipped; alone, a waits it."""
    events: list[tuple[str, object]] = []

    async def sleep(seconds):
        events.append(("sleep", seconds))

    monkeypatch.setattr("hybridllm.backends.cloud_retry._sleep", sleep)

    def handler(request):
        events.append(("ask", request.url.host))
        if request.url.host == "a.test":
            return httpx.Response(503, json={})
        return httpx.Response(429, headers={"retry-after": "60"}, json={})

    cloud = CloudBackend(base_url=["http://a.test", "http://b.test"], model="m", max_retries=2,
                         backoff_base_s=1.0, transport=httpx.MockTransport(handler))
    cloud.endpoints[1].add(100)  # a first
    monkeypatch.setattr("hybridllm.backends.cloud_retry.random.uniform", lambda lo, hi: hi)
    with pytest.raises(Exception, match="after 3 attempts: HTTP 503"):
        cloud.generate(MSGS, P)
    assert events[:5] == [("ask", "a.test"), ("sleep", 0.0), ("ask", "b.test"), ("sleep", 2.0),
                          ("ask", "a.test")], events


def test_a_long_retry_after_with_no_other_endpoint_left_fails_at_once(slept):
    handler, sent = _answers(lambda: httpx.Response(503, json={}), _429("60"))
    cloud = CloudBackend(base_url=["http://a.test", "http://b.test"], model="m", max_retries=3,
                         breaker_threshold=1, backoff_base_s=1.0, transport=httpx.MockTransport(handler))
    cloud.endpoints[1].add(100)  # a first: its 503 opens its circuit (threshold 1)
    with pytest.raises(CloudRateLimitError, match="asked to wait"):
        cloud.generate(MSGS, P)
    assert len(sent) == 2 and [s for s in slept if s > 0] == []
