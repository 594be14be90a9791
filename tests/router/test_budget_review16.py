"""Review 16 of the cloud budget: a dollar limit under a cent (or between cents) is shown as it was
set, not rounded to "$0.00/$0.00"."""

from __future__ import annotations

import pytest

from hybridllm.router.budget import Budget


@pytest.mark.parametrize("limits, tokens, spent", [
    # Before: "budget spent: $0.00/$0.00 cloud spend this hour ..." with $0.0012 spent of $0.001
    ({"max_cloud_usd_per_hour": 0.001}, 600, "budget spent: $0.001/$0.001 cloud spend this hour"),
    ({"max_cloud_usd_per_day": 0.0025}, 2_000, "budget spent: $0.0040/$0.0025 cloud spend today"),
    # cents as before, and a limit that no few decimals hold, in cents
    ({"max_cloud_usd_per_hour": 0.05}, 30_000, "budget spent: $0.06/$0.05 cloud spend this hour"),
    ({"max_cloud_usd_per_hour": 1 / 3}, 200_000, "budget spent: $0.40/$0.33 cloud spend this hour"),
])
def test_a_dollar_limit_is_shown_as_it_was_set(limits, tokens, spent):
    b = Budget(price_per_1k_tokens=0.002, **limits)
    b.record(tokens)
    assert b.exhausted().startswith(spent + " (sliding window"), b.exhausted()


def test_the_dollars_held_in_flight_are_shown_alike():
    b = Budget(max_cloud_usd_per_hour=0.001, price_per_1k_tokens=0.002)
    held, why = b.reserve(1_000)  # $0.002 held: the hour is spent while it runs
    assert held is not None and why is None
    assert b.exhausted() == ("budget spent: $0.002/$0.001 cloud spend this hour (1 in flight), $0.002 of "
                             "it reserved for the calls in flight (each its prompt plus max_tokens) "
                             "until they end")
