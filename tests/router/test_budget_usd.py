"""A cloud budget in dollars (``max_cloud_usd_per_hour`` / ``_per_day``, at
``price_per_1k_tokens``), and every one of the ledger's four call and token limits settable from the
client's settings (only two were: the per-day call and per-hour token limits could not be set)."""

from __future__ import annotations

import pytest

from hybridllm import ConfigError, HybridLLM
from hybridllm._config import HybridLLMConfig, load_config
from hybridllm.backends.fake import FakeBackend
from hybridllm.router.budget import Budget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_dollar_limit_counts_tokens_at_the_price_and_reports_dollars() -> None:
    clock = Clock()
    b = Budget(max_cloud_usd_per_day=1.0, price_per_1k_tokens=0.5, clock=clock)  # 2,000 tokens a day
    r, why = b.reserve(100)
    assert why is None and r is not None
    b.settle(r, 1500)  # $0.75
    assert b.exhausted() is None
    clock.now += 3600
    r, why = b.reserve(100)
    assert r is not None
    b.settle(r, 600)  # $1.05 in all: spent
    why = b.exhausted()
    # the first call leaves the day's window 23 h from now, and $0.30 is under $1
    assert why == "budget spent: $1.05/$1.00 cloud spend today (sliding window: room again in 23 h)"
    assert b.reserve(10) == (None, why)
    assert b.retry_after_s() == pytest.approx(23 * 3600)
    clock.now += 23 * 3600 + 1
    assert b.exhausted() is None


def test_a_dollar_limit_counts_what_is_in_flight() -> None:
    b = Budget(max_cloud_usd_per_hour=0.01, price_per_1k_tokens=1.0)  # 10 tokens an hour
    held, _ = b.reserve(12)  # its estimate already spends the hour
    assert held is not None
    assert b.exhausted() == ("budget spent: $0.01/$0.01 cloud spend this hour (1 in flight), $0.01 of "
                             "it reserved for the calls in flight (each its prompt plus max_tokens) "
                             "until they end")
    b.release(held)
    assert b.exhausted() is None


@pytest.mark.parametrize("limits, message", [
    ({"max_cloud_usd_per_day": -1.0}, "max_cloud_usd_per_day must be a non-negative number"),
    ({"max_cloud_usd_per_hour": float("nan")}, "max_cloud_usd_per_hour must be a non-negative number"),
    ({"max_cloud_usd_per_day": 5.0, "price_per_1k_tokens": 0.0}, "set the price the cloud charges"),
    ({"max_cloud_calls_per_day": -3}, "max_cloud_calls_per_day must be a non-negative integer"),
])
def test_bad_limits_are_refused_when_the_settings_load(limits, message) -> None:
    with pytest.raises(ConfigError, match=message):
        HybridLLMConfig(**limits)  # no cloud needed: checked with the other settings


def test_every_limit_from_the_environment_and_a_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HYBRIDLLM_MAX_CLOUD_USD_PER_DAY", "2.5")
    monkeypatch.setenv("HYBRIDLLM_MAX_CLOUD_CALLS_PER_DAY", "40")
    path = tmp_path / "hybridllm.toml"
    path.write_text("max_cloud_tokens_per_hour = 5000\nmax_cloud_usd_per_hour = 0.25\n"
                    "price_per_1k_tokens = 0.01\n")
    cfg = load_config(config=path)
    ledger = cfg.budget()
    assert (ledger.max_cloud_usd_per_day, ledger.max_cloud_calls_per_day) == (2.5, 40)
    assert (ledger.max_cloud_tokens_per_hour, ledger.max_cloud_usd_per_hour) == (5000, 0.25)
    assert ledger.price_per_1k_tokens == 0.01
    monkeypatch.setenv("HYBRIDLLM_MAX_CLOUD_USD_PER_DAY", "lots")
    with pytest.raises(ConfigError, match="HYBRIDLLM_MAX_CLOUD_USD_PER_DAY"):
        load_config(config=path)


def test_the_client_keeps_the_device_answering_once_the_dollars_are_spent() -> None:
    """Through HybridLLM and a real HTTP cloud: the cloud answers until the day's dollars are
    spent, then the device, with the reason in dollars."""
    from cloud_server.api.server import create_app
    from tests.cloud_server.api.fake_engine import FakeEngine
    from tests.cloud_server.api.helpers import ThreadServer
    from tests.test_combinations import CloudRouter

    server = ThreadServer(create_app(lambda: FakeEngine(step_s=0.001))).start()
    try:
        # $1 a 1,000 tokens and $0.02 a day: 20 tokens, about one short call (prompt and answer)
        with HybridLLM(edge=FakeBackend(reply=lambda m: "device"), cache=False, max_tokens=4,
                       policy=CloudRouter(), cloud_url=server.url, cloud_model="fake-model",
                       price_per_1k_tokens=1.0, max_cloud_usd_per_day=0.02) as llm:
            answers = [llm.chat(f"hello number {i}") for i in range(4)]
            tokens_day = llm.stats()["budget"]["tokens_day"]
    finally:
        server.stop()
    routes = [a.route for a in answers]
    assert routes[0] == "cloud" and routes[-1] == "edge", routes
    n = routes.count("cloud")
    assert routes == ["cloud"] * n + ["edge"] * (4 - n)
    assert tokens_day >= 20  # the calls that went spent the $0.02 at $1 a 1,000 tokens
    assert "cloud spend today" in answers[-1].reason and "/$0.02" in answers[-1].reason, answers[-1].reason
