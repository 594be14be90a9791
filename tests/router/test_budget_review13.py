"""Review 13: the budget ledger at its edges: a dollar limit reached exactly (float rounding), and
token counts or a price that are not finite numbers, refused with a clear error."""

from __future__ import annotations

import math

import pytest

from hybridllm._exceptions import ConfigError
from hybridllm.router.budget import Budget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("limit", "tokens"), [(0.05, 25_000), (0.1, 50_000), (0.07, 35_000)])
def test_a_dollar_limit_reached_exactly_is_spent(limit: float, tokens: int) -> None:
    # 25,000 tokens at $0.002 a 1,000 are $0.05, but 25000 * 0.002 / 1000 is 0.049999999999999996
    # in floats: the ledger said there was room and let one more call through
    clock = Clock()
    b = Budget(max_cloud_usd_per_hour=limit, clock=clock)
    b.record(tokens)
    why = b.exhausted()
    spent = f"budget spent: ${limit:.2f}/${limit:.2f} cloud spend this hour"
    assert why is not None and why.startswith(spent)
    assert b.reserve(10) == (None, why)
    assert b.retry_after_s() == pytest.approx(3600)
    clock.now += 3600
    assert b.exhausted() is None and b.retry_after_s() == 0.0


def test_a_dollar_limit_just_under_still_has_room() -> None:
    b = Budget(max_cloud_usd_per_hour=0.05, clock=Clock())
    b.record(24_999)  # $0.049998
    assert b.exhausted() is None


@pytest.mark.parametrize("tokens", [math.nan, math.inf, None, "5", [5]])
@pytest.mark.parametrize("method", ["record", "reserve", "settle"])
def test_tokens_that_are_not_a_count_are_refused_clearly(method: str, tokens: object) -> None:
    # NaN, inf, None or a string raised ValueError / OverflowError / TypeError from int() or "<"
    b = Budget(max_cloud_tokens_per_hour=100, clock=Clock())
    r, _ = b.reserve(1)
    call = {"record": lambda: b.record(tokens), "reserve": lambda: b.reserve(tokens),
            "settle": lambda: b.settle(r, tokens)}[method]
    with pytest.raises(ConfigError, match="tokens must be a number >= 0"):
        call()
    assert b.usage()["calls_hour"] == 0  # nothing was counted


def test_whole_token_counts_of_any_numeric_type_still_count() -> None:
    np = pytest.importorskip("numpy")
    b = Budget(max_cloud_tokens_per_hour=100, clock=Clock())
    b.record(np.int64(7))
    b.record(3.0)
    assert b.usage()["tokens_hour"] == 10


def test_an_infinite_price_is_refused() -> None:
    # with a dollar limit, a call of 0 tokens cost 0 * inf = NaN dollars, which no limit ever reached
    with pytest.raises(ConfigError, match="price_per_1k_tokens"):
        Budget(max_cloud_usd_per_hour=1.0, price_per_1k_tokens=math.inf)
