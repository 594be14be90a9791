"""Jitter on the circuit breaker's cooldown: circuits that opened at the same outage (many processes
of one app) probe the recovering endpoint spread over half the cooldown, not in lock-step. Before:
every one waited exactly cooldown_s and probed at the same moment. The doubling and the cap stay;
``seconds_until_allowed`` (the proxy's Retry-After) is when a probe is really let through."""

from __future__ import annotations

import random
import socket

import pytest

from hybridllm import CloudUnavailableError, GenerationParams
from hybridllm.backends.circuit import CircuitBreaker
from hybridllm.backends.cloud import CloudBackend


def _first_allowed(b: CircuitBreaker, now: list[float], step: float = 0.01) -> float:
    """Step the clock until a probe is admitted; the time it took from now."""
    start = now[0]
    while not b.would_allow():
        now[0] = round(now[0] + step, 6)
    return now[0] - start


def test_circuits_opened_together_probe_at_spread_times_within_half_the_cooldown():
    now = [0.0]
    waits = []
    for seed in range(40):  # 40 processes, each its own random source
        b = CircuitBreaker(threshold=1, cooldown_s=10.0, clock=lambda: now[0], rng=random.Random(seed).random)
        now[0] = 0.0
        b.trip()
        waits.append(_first_allowed(b, now))
    assert all(5.0 - 1e-9 <= w <= 10.0 + 1e-9 for w in waits), waits  # [0.5, 1] x the cooldown
    assert max(waits) - min(waits) > 3.0 and len(set(waits)) > 30, sorted(waits)  # not lock-step


def test_jitter_is_on_by_default():
    now = [0.0]
    waits = set()
    for _ in range(20):
        b = CircuitBreaker(threshold=1, cooldown_s=10.0, clock=lambda: now[0])
        b.trip()
        waits.add(b.wait_s)
    assert len(waits) > 1 and all(5.0 <= w <= 10.0 for w in waits), waits


@pytest.mark.parametrize("u", [0.0, 0.5, 0.999])
def test_doubling_and_cap_hold_under_jitter_and_retry_after_is_when_a_probe_goes(u):
    now = [0.0]
    b = CircuitBreaker(threshold=3, cooldown_s=10, max_cooldown_s=60, clock=lambda: now[0], rng=lambda: u)
    b.trip()
    nominal, waits = [], []
    for _ in range(5):
        nominal.append(b.cooldown_s)
        left = b.seconds_until_allowed()
        waits.append(_first_allowed(b, now))
        assert waits[-1] == pytest.approx(left, abs=0.011)  # Retry-After: when the probe went
        assert b.seconds_until_allowed() == 0.0
        assert b.allow()
        # a probe out: the soonest a failed one can let another go, the doubled cooldown's lowest
        assert b.seconds_until_allowed() == pytest.approx(0.5 * min(60, 2 * b.cooldown_s))
        b.trip()  # the probe failed
    assert nominal == [10, 20, 40, 60, 60]  # the doubling and the cap, as before
    factor = 1 - 0.5 * u
    assert waits == pytest.approx([n * factor for n in nominal], abs=0.011)
    now[0] += 60
    assert b.allow()
    b.record_success()
    assert b.cooldown_s == 10 and b.wait_s == 10 and b.state == "closed"


def test_the_cloud_clients_message_gives_this_openings_wait():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    cloud = CloudBackend(base_url=dead, model="m", max_retries=0, breaker_cooldown_s=10)
    cloud.endpoints[0].breaker._rng = lambda: 0.5  # a wait of 7.5 s, not the nominal 10
    with pytest.raises(CloudUnavailableError, match=r"not asked again for 7\.5 s"):
        cloud.generate([{"role": "user", "content": "hi"}], GenerationParams(max_tokens=4))
    assert cloud.retry_after_s() == pytest.approx(7.5, abs=0.5)
