"""Carbon-aware placement with two local endpoints of different stated intensity: our cloud server's
app (a fake engine) on two ports, one fast on a dirty grid, one slow on a clean one."""

from __future__ import annotations

import pytest

from hybridllm import HybridLLM
from hybridllm._exceptions import ConfigError, InvalidRequestError
from hybridllm.backends.fake import FakeBackend
from hybridllm.carbon import J_PER_KWH, CarbonPlacer, CloudEndpoint
from tests.cloud_server.api.fake_engine import FakeEngine
from tests.cloud_server.api.helpers import ThreadServer

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def endpoints():
    from cloud_server.api.server import create_app

    fast = ThreadServer(create_app(lambda: FakeEngine(step_s=0.001))).start()
    slow = ThreadServer(create_app(lambda: FakeEngine(step_s=0.25))).start()
    yield fast.url, slow.url
    fast.stop()
    slow.stop()


def test_batch_goes_to_the_cleanest_grid_interactive_to_the_fastest(endpoints):
    fast_url, slow_url = endpoints
    intensity = {"value": 50.0}
    marked = [
        {"url": fast_url, "region": "us-east-1", "carbon_intensity": 400},
        CloudEndpoint(slow_url, region="eu-north-1", carbon_intensity=lambda: intensity["value"]),
    ]
    with HybridLLM(
        edge=FakeBackend(), cache=False, cloud_endpoints=marked, max_tokens=8, cloud_model="fake-model"
    ) as llm:
        for _ in range(4):  # both endpoints get measured; then interactive sticks to the fast one
            llm.chat("hello", route="cloud")
        regions = [llm.chat("hello", route="cloud").region for _ in range(3)]
        assert regions == ["us-east-1"] * 3
        saved_before = llm.stats()["co2_saved_g"]
        c = llm.chat("summarise", route="cloud", priority="batch")
        assert c.region == "eu-north-1" and c.route == "cloud"
        assert c.energy_source in ("nvml", "rapl", "estimate") and c.energy_j > 0  # the server's
        kwh = c.energy_j / J_PER_KWH
        assert c.co2_g == pytest.approx(kwh * 50)
        assert c.co2_saved_g == pytest.approx(kwh * (400 - 50))
        stats = llm.stats()
        assert stats["co2_saved_g"] == pytest.approx(saved_before + round(c.co2_saved_g, 6), abs=1e-6)
        assert stats["co2_g"] > 0
        intensity["value"] = 900.0  # the clean grid turned dirty: batch follows the feed
        assert llm.chat("summarise", route="cloud", priority="batch").region == "us-east-1"


def test_an_unhealthy_clean_endpoint_is_skipped(endpoints):
    fast_url, _ = endpoints
    from tests.cloud_server.api.helpers import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    marked = [
        {"url": fast_url, "region": "dirty", "carbon_intensity": 700},
        {"url": dead, "region": "clean", "carbon_intensity": 10},
    ]
    with HybridLLM(
        edge=FakeBackend(),
        cache=False,
        cloud_endpoints=marked,
        max_tokens=4,
        cloud_model="fake-model",
        cloud_breaker_threshold=1,
        cloud_breaker_cooldown_s=60,
    ) as llm:
        first = llm.chat("x", route="cloud", priority="batch")  # the clean one fails: retried
        assert first.region == "dirty"
        assert llm.chat("x", route="cloud", priority="batch").region == "dirty"  # circuit open


class _Ep:
    def __init__(self, url: str, healthy: bool = True) -> None:
        self.base_url, self.outstanding_tokens, self.requests = url, 0, 0
        self.breaker = type("B", (), {"would_allow": lambda s: healthy, "allow": lambda s: healthy})()


def test_placer_order_unknown_intensity_last_and_a_failing_feed_is_unknown():
    def broken() -> float:
        raise RuntimeError("feed down")

    now = [0.0]
    placer = CarbonPlacer(
        [
            CloudEndpoint("http://a", carbon_intensity=300),
            CloudEndpoint("http://b", carbon_intensity=broken),
            CloudEndpoint("http://c"),
        ],
        root=lambda u: u,
        explore_after_s=10,
        clock=lambda: now[0],
    )
    eps = [_Ep("http://b"), _Ep("http://c"), _Ep("http://a")]
    assert placer.pick(eps, set(), "batch").base_url == "http://a"
    placer.observe_ttft("http://a", 2.0)
    placer.observe_ttft("http://b", 0.5)
    placer.observe_ttft("http://c", 1.0)
    assert placer.pick(eps, set(), "interactive").base_url == "http://b"
    now[0] = 5.0
    placer.observe_ttft("http://b", 0.5)
    now[0] = 12.0  # a and c were last measured 12 s ago: measured again before b
    assert placer.pick(eps, set(), "interactive").base_url in ("http://a", "http://c")
    assert (
        placer.pick([_Ep("http://a", healthy=False), _Ep("http://c")], set(), "batch").base_url == "http://c"
    )
    got = placer.account("http://a", "http://b", None, None, tokens=100)
    assert got["energy_source"] == "estimate" and got["energy_j"] == 100.0
    assert got["co2_g"] == pytest.approx(100 / J_PER_KWH * 300) and got["co2_saved_g"] is None


def test_validation():
    with pytest.raises(ConfigError):
        CloudEndpoint("ftp://x")
    with pytest.raises(ConfigError):
        CloudEndpoint("http://x", carbon_intensity=-5)
    with pytest.raises(ConfigError):
        CloudEndpoint.of({"url": "http://x", "carbon": 5})
    with HybridLLM(edge=FakeBackend(), cache=False) as llm, pytest.raises(InvalidRequestError):
        llm.chat("x", priority="urgent")


def test_a_feed_is_asked_once_per_request_and_the_request_is_accounted_with_the_figure_it_was_placed_by(
    endpoints,
):
    """Before: the feed was asked again after the answer (twice per request, plus once per choice), so
    a feed that failed (or moved) meanwhile gave co2_g None (or figures of another intensity)."""
    fast_url, slow_url = endpoints
    calls = {"clean": 0, "dirty": 0}

    def feed(name: str, value: float):
        def read() -> float:
            calls[name] += 1
            if calls[name] > 1:
                raise RuntimeError("feed timed out")
            return value

        return read

    marked = [
        CloudEndpoint(fast_url, region="dirty", carbon_intensity=feed("dirty", 600.0)),
        CloudEndpoint(slow_url, region="clean", carbon_intensity=feed("clean", 20.0)),
    ]
    with HybridLLM(
        edge=FakeBackend(), cache=False, cloud_endpoints=marked, max_tokens=4, cloud_model="fake-model"
    ) as llm:
        # the endpoint an interactive request is placed on (the runtime's choice) is measured fastest
        ep, ticket, _ = llm.cloud._pick(set(), "interactive", {})
        ep.breaker.release_probe(ticket)
        llm.cloud.placer.observe_ttft(ep.base_url, 0.0)
        c = llm.chat("summarise", route="cloud", priority="batch")
    assert calls == {"clean": 1, "dirty": 1}
    kwh = c.energy_j / J_PER_KWH
    assert c.region == "clean" and c.co2_g == pytest.approx(kwh * 20.0)
    assert c.co2_saved_g == pytest.approx(kwh * (600.0 - 20.0))


def test_one_server_named_twice_is_one_endpoint_and_two_intensities_for_it_are_refused():
    """Before: "http://h" and "http://h/v1" were two endpoints with two breakers (the server got twice
    its share), and two intensities for one server silently kept the last."""
    from hybridllm.backends.cloud import CloudBackend

    cloud = CloudBackend(base_url=["http://h.test", "http://h.test/v1/"], model="m",
                         carbon=[{"url": "http://h.test/v1", "carbon_intensity": 5}])
    assert [e.base_url for e in cloud.endpoints] == ["http://h.test/v1"]
    with pytest.raises(ConfigError, match="listed twice"):
        CloudBackend(base_url="http://g.test", carbon=[
            {"url": "http://h.test/v1", "carbon_intensity": 5},
            {"url": "http://h.test/", "carbon_intensity": 500},
        ])


def test_feed_values_numpy_numbers_count_and_bad_ones_are_unknown_with_a_warning(caplog):
    import numpy as np

    assert CloudEndpoint("http://x", carbon_intensity=np.int64(30)).intensity() == 30.0
    assert CloudEndpoint("http://x", carbon_intensity=lambda: np.float32(12.5)).intensity() == 12.5
    for bad in (float("nan"), -1.0, None, "30", float("inf")):
        caplog.clear()
        assert CloudEndpoint("http://x", carbon_intensity=lambda v=bad: v).intensity() is None
        assert "treated as unknown" in caplog.text, bad
