"""The circuit breaker (review 21): a streamed half-open probe closes the circuit at its first token,
not when its answer ends; its cooldowns count the time a laptop sleeps."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx
import pytest

from hybridllm import GenerationParams
from hybridllm.backends.circuit import CircuitBreaker
from hybridllm.backends.cloud import CloudBackend

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=8, temperature=0)


def _sse(*texts):
    events = [{"choices": [{"delta": {"content": t}, "finish_reason": None}]} for t in texts]
    events.append({"choices": [{"delta": {}, "finish_reason": "stop"}]})
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


def _open_cloud():
    cloud = CloudBackend(base_url="http://cloud.test", model="m",
                         transport=httpx.MockTransport(lambda r: _sse("one", " two", " three")),
                         breaker_threshold=1, breaker_cooldown_s=10, backoff_base_s=0.0)
    br = cloud.endpoints[0].breaker
    br.trip()
    br._opened_at -= 60  # the cooldown is over: the next request is the probe
    return cloud, br


def test_a_probe_that_streams_closes_the_circuit_at_its_first_token():
    """Before, the circuit stayed half-open with its probe out until the probe's whole answer
    ended: every other request went to the device meanwhile, for as long as a long answer took, or
    for good while its caller held the stream unread (a notebook's ``s = llm.stream(q); next(s)``)."""
    cloud, br = _open_cloud()

    async def run():
        agen = cloud.astream(MSGS, P)
        first = await anext(agen)
        assert first.text == "one"
        try:
            return br.state, br.would_allow()
        finally:
            await agen.aclose()

    assert asyncio.run(run()) == ("closed", True)
    assert br.state == "closed"


def test_a_probe_that_breaks_after_its_first_token_counts_as_a_failure():
    """The stream breaking later is still a failure the circuit counts (threshold 1: open again)."""
    def broken(request):
        async def body():
            yield b'data: {"choices": [{"delta": {"content": "one"}, "finish_reason": null}]}\n\n'
            raise httpx.ReadError("connection reset")

        return httpx.Response(200, stream=_Stream(body()), headers={"content-type": "text/event-stream"})

    cloud = CloudBackend(base_url="http://cloud.test", model="m", transport=httpx.MockTransport(broken),
                         breaker_threshold=1, breaker_cooldown_s=10, backoff_base_s=0.0)
    br = cloud.endpoints[0].breaker
    br.trip()
    br._opened_at -= 60

    async def run():
        seen = []
        with pytest.raises(Exception, match="broke off"):
            async for d in cloud.astream(MSGS, P):
                seen.append(d.text)
        return seen

    assert asyncio.run(run()) == ["one"]
    assert br.state == "open"


class _Stream(httpx.AsyncByteStream):
    def __init__(self, agen):
        self._agen = agen

    async def __aiter__(self):
        async for chunk in self._agen:
            yield chunk


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME") and sys.platform != "darwin",
                    reason="no sleep-counting clock on this system")
def test_an_open_circuit_counts_the_time_the_machine_slept(monkeypatch):
    """time.monotonic stops while a laptop sleeps (Linux, macOS): a circuit opened before an
    hour's sleep still waited out its cooldown on waking. Its default clock counts the sleep."""
    slept = {"s": 0.0}
    real = time.clock_gettime

    def clock_gettime(clock_id):
        return real(clock_id) + slept["s"]  # every clock but time.monotonic moved on

    frozen = time.monotonic()
    monkeypatch.setattr(time, "clock_gettime", clock_gettime)
    monkeypatch.setattr(time, "monotonic", lambda: frozen)  # asleep, it does not move
    br = CircuitBreaker(threshold=1, cooldown_s=300, rng=lambda: 0.0)
    br.trip()
    assert br.state == "open"
    slept["s"] = 3600.0  # an hour's sleep
    assert br.state == "half-open" and br.would_allow()
