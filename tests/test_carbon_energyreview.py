"""Carbon intensity feeds that misbehave: one that hangs must not hold requests (nor be waited for
again by each one), one that keeps failing is warned about once, not per request, and a bogus value
never places a request."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from hybridllm import HybridLLM
from hybridllm.backends.fake import FakeBackend
from hybridllm.carbon import CarbonPlacer, CloudEndpoint

pytest.importorskip("fastapi")


class _Ep:
    def __init__(self, url: str) -> None:
        self.base_url, self.outstanding_tokens, self.requests = url, 0, 0
        self.breaker = type("B", (), {"would_allow": lambda s: True, "allow": lambda s: True})()


def _hanging(calls: list[float], release: threading.Event):
    def feed() -> float:
        calls.append(time.monotonic())
        release.wait(10)  # a live feed whose HTTP call never returns
        return 10.0

    return feed


def test_a_hung_feed_costs_one_timeout_once_and_is_not_asked_again_while_hung():
    """Before: intensity() called the feed inline: every request waited as long as the feed hung."""
    calls: list[float] = []
    release = threading.Event()
    ep = CloudEndpoint("http://clean.test", carbon_intensity=_hanging(calls, release))
    ep.feed_timeout_s = 1.0
    try:
        t0 = time.monotonic()
        assert ep.intensity() is None
        first = time.monotonic() - t0
        assert 0.9 < first < 5.0
        t0 = time.monotonic()
        assert ep.intensity() is None and ep.intensity() is None  # still hung: not waited for again
        # even one more timeout would be 1 s: under that, with room for a busy CI host's pauses
        assert time.monotonic() - t0 < 0.9
        assert len(calls) == 1
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while ep.intensity() is None and time.monotonic() < deadline:  # answered: asked afresh
        time.sleep(0.01)
    assert ep.intensity() == 10.0 and len(calls) >= 2


def test_a_batch_request_is_not_held_by_a_hung_feed_and_goes_to_a_known_grid():
    from cloud_server.api.server import create_app
    from tests.cloud_server.api.fake_engine import FakeEngine
    from tests.cloud_server.api.helpers import ThreadServer

    calls: list[float] = []
    release = threading.Event()
    a = ThreadServer(create_app(lambda: FakeEngine(step_s=0.001))).start()
    b = ThreadServer(create_app(lambda: FakeEngine(step_s=0.001))).start()
    hung = CloudEndpoint(a.url, region="hung", carbon_intensity=_hanging(calls, release))
    hung.feed_timeout_s = 0.2
    try:
        with HybridLLM(edge=FakeBackend(), cache=False, max_tokens=4, cloud_model="fake-model",
                       cloud_endpoints=[hung, {"url": b.url, "region": "known", "carbon_intensity": 300}],
                       ) as llm:
            t0 = time.monotonic()
            answers = [llm.chat("summarise", route="cloud", priority="batch") for _ in range(3)]
            took = time.monotonic() - t0
        assert [c.region for c in answers] == ["known"] * 3
        assert all(c.route == "cloud" for c in answers)
        assert took < 3.0, took  # one 0.2 s timeout, not three 10 s hangs
        assert len(calls) == 1
    finally:
        release.set()
        a.stop()
        b.stop()


def test_a_failing_feed_warns_once_until_it_recovers(caplog):
    """Before: a warning per request (a feed down for an hour at 10 requests/s: 36,000 lines)."""
    state = {"fail": True}

    def feed() -> float:
        if state["fail"]:
            raise ConnectionError("grid API down")
        return 42.0

    ep = CloudEndpoint("http://x.test", carbon_intensity=feed)
    with caplog.at_level(logging.INFO, logger="hybridllm.carbon"):
        for _ in range(20):
            assert ep.intensity() is None
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "grid API down" in warnings[0].getMessage()
        state["fail"] = False
        assert ep.intensity() == 42.0
        assert "answers again" in caplog.text
        state["fail"] = True
        ep.intensity()
        ep.intensity()
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 2  # a new outage


@pytest.mark.parametrize("bogus", [float("nan"), -50.0, "5", float("inf"), None, True])
def test_a_bogus_figure_never_places_a_batch_request(bogus):
    placer = CarbonPlacer(
        [CloudEndpoint("http://bogus", carbon_intensity=lambda: bogus),
         CloudEndpoint("http://real", carbon_intensity=lambda: 700.0)],
        root=lambda u: u,
    )
    seen: dict[str, float | None] = {}
    assert placer.pick([_Ep("http://bogus"), _Ep("http://real")], set(), "batch", seen).base_url == "http://real"
    got = placer.account("http://real", "http://bogus", 3600.0, "nvml", 10, seen)
    assert got["co2_g"] == pytest.approx(0.7) and got["co2_saved_g"] is None  # no baseline: no claim
