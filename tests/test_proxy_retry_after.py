"""The proxy's 503 for a prompt only the cloud can take, while the cloud is down, says when to
retry: when the endpoint's circuit lets a request through again, not a fixed second."""

from __future__ import annotations

import socket

import pytest

from hybridllm.backends.circuit import CircuitBreaker
from hybridllm.backends.cloud import CloudBackend

from .test_context_window import LONG
from .test_context_window import client as long_prompt_client


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_down_cloud_gives_its_cooldown_as_retry_after():
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    cloud = CloudBackend(base_url=f"http://127.0.0.1:{_closed_port()}", model="m",
                         breaker_cooldown_s=40.0, max_retries=0)
    cloud.endpoints[0].breaker._rng = lambda: 0.0  # no jitter: the whole cooldown
    llm, _ = long_prompt_client(cloud)
    body = {"model": "x", "messages": [{"role": "user", "content": LONG}]}
    with TestClient(create_app(llm)) as http:
        first = http.post("/v1/chat/completions", json=body)  # refused: the circuit opens
        second = http.post("/v1/chat/completions", json={**body, "stream": True})
    llm.close()
    for r in (first, second):
        assert r.status_code == 503 and r.json()["error"]["type"] == "upstream_unavailable", r.text
        assert 30 <= int(r.headers["retry-after"]) <= 40, r.headers


def test_the_wait_is_what_is_left_of_the_cooldown_and_a_probe_out_waits_one_more():
    now = [0.0]
    breaker = CircuitBreaker(threshold=1, cooldown_s=10.0, clock=lambda: now[0], rng=lambda: 0.0)
    assert breaker.seconds_until_allowed() == 0.0
    breaker.trip()
    now[0] = 4.0
    assert breaker.seconds_until_allowed() == pytest.approx(6.0)
    now[0] = 10.0
    assert breaker.seconds_until_allowed() == 0.0  # half-open: a probe may go
    assert breaker.allow()
    assert breaker.seconds_until_allowed() == 10.0  # the probe is out
    breaker.record_success()
    assert breaker.seconds_until_allowed() == 0.0
