"""The half-open probe belongs to the request that took it (helper-e3): a request admitted while the
circuit was closed that ends while the probe is out neither frees the probe's slot nor counts as a
failed probe; a clock set back does not keep an open circuit open until it catches up."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from hybridllm import CloudUnavailableError, GenerationParams
from hybridllm.backends.circuit import CircuitBreaker
from hybridllm.backends.cloud import CloudBackend

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=8, temperature=0)


def sse(text):
    events = [{"choices": [{"delta": {"content": text}, "finish_reason": None}]},
              {"choices": [{"delta": {}, "finish_reason": "stop"}]}]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


class Gated:
    """Holds the n-th POST until ``release(n, response)``; records the order they came in."""

    def __init__(self):
        self.arrived: list[asyncio.Event] = [asyncio.Event() for _ in range(4)]
        self.gates: list[asyncio.Future] = []

    async def __call__(self, request):
        n = sum(e.is_set() for e in self.arrived)
        self.gates.append(asyncio.get_running_loop().create_future())
        self.arrived[n].set()
        return await self.gates[n]

    def release(self, n, response):
        self.gates[n].set_result(response)


def _cloud(gated, **kw):
    return CloudBackend(base_url="http://cloud.test", model="m", transport=httpx.MockTransport(gated),
                        breaker_threshold=1, breaker_cooldown_s=10, backoff_base_s=0.0, **kw)


async def _first(agen):
    return await anext(agen)


async def _open_with_probe_out(cloud, gated):
    """Request A goes out while closed and hangs; the circuit opens, its cooldown passes and probe
    B goes out and hangs. Returns (A's task, B's generator and task)."""
    br = cloud.endpoints[0].breaker
    agen_a = cloud.astream(MSGS, P)
    task_a = asyncio.ensure_future(_first(agen_a))
    await gated.arrived[0].wait()
    br.trip()  # another request found the endpoint down meanwhile
    br._opened_at -= 60  # its cooldown is over: one probe may go
    agen_b = cloud.astream(MSGS, P)
    task_b = asyncio.ensure_future(_first(agen_b))
    await gated.arrived[1].wait()
    assert br.state == "half-open" and not br.would_allow()  # B is the probe
    return agen_a, task_a, agen_b, task_b


def test_a_closed_time_request_giving_up_does_not_free_the_probe_slot():
    async def main():
        gated = Gated()
        cloud = _cloud(gated)
        br = cloud.endpoints[0].breaker
        agen_a, task_a, agen_b, task_b = await _open_with_probe_out(cloud, gated)
        task_a.cancel()  # A's caller gives up before its first token
        with pytest.raises(asyncio.CancelledError):
            await task_a
        await agen_a.aclose()
        # before: A's release_probe() freed B's slot, and a second probe went out at once
        assert not br.would_allow()
        with pytest.raises(CloudUnavailableError):
            await anext(cloud.astream(MSGS, P))
        assert len(gated.gates) == 2  # no third request reached the endpoint
        gated.release(1, sse("back"))  # the probe's own answer closes the circuit
        assert (await task_b).text == "back"
        async for _ in agen_b:
            pass
        assert br.state == "closed"
        await cloud.aclose()

    asyncio.run(main())


def test_a_closed_time_request_failing_late_is_not_a_failed_probe():
    async def main():
        gated = Gated()
        cloud = _cloud(gated, max_retries=0)
        br = cloud.endpoints[0].breaker
        agen_a, task_a, agen_b, task_b = await _open_with_probe_out(cloud, gated)
        gated.release(0, httpx.Response(503, json={}))  # A fails now, late
        with pytest.raises(CloudUnavailableError):
            await task_a
        # before: counted as the probe's failure: the cooldown doubled (20 s) and the circuit
        # reopened with the probe still out (its slot freed for another)
        assert br.cooldown_s == 10
        assert br.state == "half-open" and not br.would_allow()
        gated.release(1, httpx.Response(503, json={}))  # now the probe itself fails
        with pytest.raises(CloudUnavailableError):
            await task_b
        assert br.state == "open" and br.cooldown_s == 20  # one failed probe: one doubling
        await agen_a.aclose()
        await agen_b.aclose()
        await cloud.aclose()

    asyncio.run(main())


def test_tickets_decide_only_for_their_own_probe():
    now = [0.0]
    b = CircuitBreaker(threshold=1, cooldown_s=10, clock=lambda: now[0], rng=lambda: 0.0)
    early = b.allow()  # admitted while closed
    b.trip(b.allow())  # another request: the endpoint is down
    now[0] = 10
    probe = b.allow()
    assert probe and probe.probe and not early.probe
    b.release_probe(early)
    b.record_failure(early)
    b.trip(early)
    assert b.state == "half-open" and not b.would_allow() and b.cooldown_s == 10
    b.release_probe(probe)  # the probe's own release frees its slot
    assert b.would_allow()
    probe = b.allow()
    b.record_failure(probe)
    assert b.state == "open" and b.cooldown_s == 20


def test_a_clock_set_back_re_anchors_an_open_circuit():
    now = [1000.0]
    b = CircuitBreaker(threshold=1, cooldown_s=10, clock=lambda: now[0], rng=lambda: 0.0)
    b.record_failure()
    now[0] = 100.0  # the clock is set back 900 s
    assert b.state == "open"
    # before: open (and 910 s to wait) until the clock came back to 1010
    assert b.seconds_until_allowed() == 10
    now[0] = 110.0
    assert b.state == "half-open" and b.allow()


def test_an_undecodable_body_is_a_failure_not_a_traceback_nor_a_stuck_probe():
    """A body that its content-encoding cannot decode (a proxy's broken gzip): before, httpx's
    DecodingError reached the caller (a traceback, no answer from the device), and when the request
    was the half-open probe its slot stayed taken for good: no request went to the cloud again."""
    def broken(request):
        return httpx.Response(200, content=b"\x1f\x8b not gzip", headers={
            "content-encoding": "gzip", "content-type": "text/event-stream"})

    cloud = CloudBackend(base_url="http://cloud.test", model="m", transport=httpx.MockTransport(broken),
                         breaker_threshold=1, breaker_cooldown_s=10, backoff_base_s=0.0, max_retries=0)
    br = cloud.endpoints[0].breaker
    br.trip()
    br._opened_at -= 60  # the cooldown is over: this request is the probe
    with pytest.raises(CloudUnavailableError, match="undecodable"):
        cloud.generate(MSGS, P)
    assert br.state == "open" and br.cooldown_s == 20  # a failed probe
    br._opened_at -= 60
    assert br.would_allow()  # the next probe may go


def test_an_unexpected_error_frees_the_probe_slot():
    """Any error the client does not know (here the transport's own bug) frees the probe it held:
    before, the slot stayed taken and the circuit half-open for good (the cloud never asked again)."""
    def buggy(request):
        raise RuntimeError("a bug below the client")

    cloud = CloudBackend(base_url="http://cloud.test", model="m", transport=httpx.MockTransport(buggy),
                         breaker_threshold=1, breaker_cooldown_s=10)
    br = cloud.endpoints[0].breaker
    br.trip()
    br._opened_at -= 60
    with pytest.raises(RuntimeError):
        cloud.generate(MSGS, P)
    assert br.would_allow()


def test_a_retry_waits_out_the_retry_after_of_an_endpoint_that_asked_while_another_failed(monkeypatch):
    """a answers 429 with Retry-After: 5, b (tried meanwhile) fails twice and its circuit opens: the
    request waits out a's 5 s before asking it again. Before, a was asked again at once (a retry
    spent on a certain 429), since only a request's first attempt waited for a Retry-After."""
    events = []

    async def sleep(seconds):
        events.append(("sleep", round(seconds, 1)))

    monkeypatch.setattr("hybridllm.backends.cloud_retry._sleep", sleep)
    asked = {"a": 0}

    def handler(request):
        host = request.url.host
        events.append(("ask", host))
        if host == "a":
            asked["a"] += 1
            if asked["a"] == 1:
                return httpx.Response(429, json={}, headers={"retry-after": "5"})
            return sse("ok")
        return httpx.Response(503, json={})

    cloud = CloudBackend(base_url=["http://a", "http://b"], model="m", breaker_threshold=2,
                         backoff_base_s=0.0, transport=httpx.MockTransport(handler))
    assert cloud.generate(MSGS, P).text == "ok"
    assert events[-2:] == [("sleep", 5.0), ("ask", "a")]
    assert [e for e in events if e[0] == "ask"] == [("ask", "a"), ("ask", "b"), ("ask", "b"), ("ask", "a")]


@pytest.mark.parametrize("bad", [
    {"read_timeout_s": -1}, {"read_timeout_s": 0}, {"connect_timeout_s": float("nan")},
    {"backoff_max_s": float("nan")}, {"backoff_base_s": None}, {"max_retries": None}, {"max_retries": 1.5},
])
def test_bad_timeouts_and_retries_are_config_errors(bad):
    """Before: read_timeout_s=-1 failed every request at once (each answer from the device, no word
    why); max_retries=None was a TypeError at the first failure."""
    from hybridllm import ConfigError

    with pytest.raises(ConfigError, match=next(iter(bad))):
        CloudBackend(base_url="http://cloud.test", model="m", **bad)


def test_a_whole_answer_that_trickles_in_is_bounded():
    """A server that ignores "stream": true and sends its JSON a few bytes at a time, each within
    the read timeout: before, the request waited on it without end (32 MiB at that pace is days)."""
    async def body():
        yield b'{"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]'
        while True:
            await asyncio.sleep(0.05)
            yield b" "

    def handler(request):
        return httpx.Response(200, headers={"content-type": "application/json"}, content=body())

    cloud = CloudBackend(base_url="http://cloud.test", model="m", transport=httpx.MockTransport(handler),
                         read_timeout_s=0.2, max_retries=0)

    async def main():
        try:
            async with asyncio.timeout(5):  # the old code never returned
                with pytest.raises(CloudUnavailableError, match="no whole answer within 0.4 s"):
                    async for _ in cloud.astream(MSGS, P):
                        pass
        finally:
            await cloud.aclose()

    asyncio.run(main())
