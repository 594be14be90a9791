"""Review 15 of the request pipeline: the cache key's stop strings, and the budget's reason when
reservations in flight are what spend it."""

from __future__ import annotations

import asyncio

from hybridllm import AsyncHybridLLM
from tests.router.test_budget_concurrency import WaitingCloud, _together
from tests.router.test_budget_concurrency import make as make_budgeted
from tests.test_pipeline import FakeCache, make


def test_the_order_of_stop_strings_does_not_miss_the_cache():
    # an answer is cut at the first match of any stop string: ["a", "b"] and ["b", "a"] are one
    # request. Before, the order was part of the key, and the second ask was answered again
    cache = FakeCache()
    llm, edge, _ = make(cache=cache)
    first = llm.chat("easy question", stop=["###", "END"])
    again = llm.chat("easy question", stop=["END", "###"])
    twice = llm.chat("easy question", stop=["END", "###", "END"])
    assert (first.route, again.route, twice.route) == ("edge", "cache", "cache")
    assert cache.puts == 1
    # other stop strings are another request
    assert llm.chat("easy question", stop=["END"]).route == "edge"
    llm.close()


def test_a_huge_max_tokens_says_the_budget_is_held_not_spent():
    # max_tokens=10**9 reserves 10**9 tokens while its call runs: a request planned meanwhile is
    # kept on the device. Before, its reason said "budget spent: 1000000007/100000" with nothing
    # spent and no word of why; now it says that the calls in flight hold it
    cloud = WaitingCloud()
    llm, _ = make_budgeted(cloud, max_cloud_tokens_per_hour=100_000)
    out = asyncio.run(_together(AsyncHybridLLM.wrap(llm), cloud, ["hard question 1", "hard question 2"],
                                max_tokens=10**9))
    assert sorted(c.route for c in out) == ["cloud", "edge"]
    kept = next(c for c in out if c.route == "edge")
    assert ("1000000007/100000 cloud tokens this hour (1 in flight), 1000000007 of it reserved for the "
            "calls in flight (each its prompt plus max_tokens) until they end") in kept.reason, kept.reason
    assert llm.stats()["budget"]["tokens_hour"] == 32  # what was really spent
    llm.close()
