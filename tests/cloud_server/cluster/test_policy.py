"""The routing decision on plain data: prefix affinity, the overload margin, token-aware balance,
the router's own books, and Ray Serve's RequestRouter shell driven with fake replicas."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from cloud_server.cluster.policy import TokenAwareRouter, estimate_tokens, prompt_block_hashes
from cloud_server.engine.block_manager import BlockManager
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.sequence import Sequence

BS = 4


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def hashes(tokens: list[int]) -> list[int]:
    return prompt_block_hashes(tokens, BS)


def test_prompt_hashes_are_the_engines_prefix_cache_hashes():
    bm = BlockManager(16, BS)
    seq = Sequence("a", list(range(11)), SamplingParams())
    bm.allocate_prefix(seq)
    bm.append_slots(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.commit(seq)
    # 11 tokens: two full blocks looked up (the last token is always computed)
    assert hashes(list(range(11))) == seq.block_hashes[:2]
    assert set(hashes(list(range(11)))) <= set(bm.cached_block_hashes())
    assert hashes([1, 2, 3, 4]) == [] and len(hashes([1, 2, 3, 4, 5])) == 1  # last token computed
    assert hashes(list(range(9)))[:2] == hashes(list(range(12)))[:2]
    assert hashes([9] + list(range(1, 12)))[0] != hashes(list(range(12)))[0]


def test_prompt_hashes_are_the_same_in_another_process():
    # the router (front-end process) compares its hashes with those a replica process reports
    import subprocess
    import sys

    code = (
        "from cloud_server.cluster.policy import prompt_block_hashes;"
        "print(prompt_block_hashes(list(range(40)), 4))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(hashes(list(range(40))))


def test_longest_cached_prefix_wins_while_not_overloaded():
    r = TokenAwareRouter(block_size=BS, min_margin_tokens=10, imbalance_ratio=0.0)
    prompt = list(range(40))
    r.on_report("a", {"outstanding_tokens": 30, "prefix_hashes": hashes(prompt)[:3]})
    r.on_report("b", {"outstanding_tokens": 5, "prefix_hashes": hashes(prompt)[:8]})
    r.on_report("c", {"outstanding_tokens": 0, "prefix_hashes": []})
    choice = r.choose(["a", "b", "c"], hashes(prompt))
    assert (choice.replica, choice.reason, choice.matched_blocks) == ("b", "prefix", 8)


def test_overloaded_prefix_holder_spills_to_the_least_loaded():
    prompt = list(range(40))  # 9 blocks looked up
    r = TokenAwareRouter(block_size=BS, min_margin_tokens=10, imbalance_ratio=0.0, prefill_weight=1.0)
    r.on_report("a", {"outstanding_tokens": 0, "prefix_hashes": []})
    # margin = 10 + 4 tokens * 9 matched blocks = 46: within it, the cache wins
    r.on_report("b", {"outstanding_tokens": 46, "prefill_tokens": 46, "prefix_hashes": hashes(prompt)})
    assert r.choose(["a", "b"], hashes(prompt)).replica == "b"
    r.on_report("b", {"outstanding_tokens": 47, "prefill_tokens": 47, "prefix_hashes": hashes(prompt)})
    choice = r.choose(["a", "b"], hashes(prompt))
    assert (choice.replica, choice.reason) == ("a", "spill")


def test_margin_grows_with_the_least_load():
    prompt = list(range(8))
    r = TokenAwareRouter(block_size=BS, min_margin_tokens=0, imbalance_ratio=0.5, prefill_weight=1.0)
    r.on_report("a", {"outstanding_tokens": 1000, "prefill_tokens": 1000, "prefix_hashes": []})
    r.on_report("b", {"outstanding_tokens": 1400, "prefill_tokens": 1400, "prefix_hashes": hashes(prompt)})
    assert r.choose(["a", "b"], hashes(prompt)).replica == "b"  # 1400 <= 1000 + 500 + 4
    r.on_report("b", {"outstanding_tokens": 1600, "prefill_tokens": 1600, "prefix_hashes": hashes(prompt)})
    assert r.choose(["a", "b"], hashes(prompt)).replica == "a"


def test_new_tenants_spread_over_the_caches_then_stick():
    # four tenants arrive one after another on an idle fleet: equal loads, so each new prefix goes
    # to the replica whose cache holds the fewest blocks (not always the first one)
    r = TokenAwareRouter(block_size=BS)
    tenants = [[t] * 3 + list(range(100 * t, 100 * t + 37)) for t in range(1, 5)]
    placed = {}
    for i, tenant in enumerate(tenants):
        h = hashes(tenant + [1])
        choice = r.choose(["a", "b"], h)
        assert choice.reason == "least-tokens"
        r.on_sent(choice.replica, f"w{i}", h, 10)
        r.on_done(f"w{i}")
        placed[i] = choice.replica
    assert sorted(placed.values()) == ["a", "a", "b", "b"]
    # afterwards each tenant's requests go where its prefix is, even with some load there
    for i, tenant in enumerate(tenants):
        r.on_sent(placed[i], f"busy{i}", [], 160)  # margin: 128 + 10 blocks x 4 tokens
        choice = r.choose(["a", "b"], hashes(tenant + [2]))
        assert (choice.replica, choice.reason) == (placed[i], "prefix")
        r.on_done(f"busy{i}")


def test_defaults_keep_a_long_prefix_against_running_answers_not_against_a_prefill_queue():
    # a 500-token cached prefix is worth its prefill (margin 128 + 32 blocks x 16 tokens = 640);
    # decode tokens of running answers count at half: they do not queue ahead of a new prompt
    r = TokenAwareRouter(block_size=16)
    prompt = list(range(520))
    h = prompt_block_hashes(prompt, 16)
    r.on_report("a", {"outstanding_tokens": 0, "prefix_hashes": []})
    for decode in (600, 1200):  # two or four 256-token answers more than the idle replica
        r.on_report("b", {"outstanding_tokens": decode, "prefill_tokens": 0, "prefix_hashes": h})
        assert r.choose(["a", "b"], h).reason == "prefix"
    r.on_report("b", {"outstanding_tokens": 1400, "prefill_tokens": 0, "prefix_hashes": h})
    assert r.choose(["a", "b"], h).reason == "spill"  # 700 > 640
    # prompts waiting to be prefilled delay the new request's first token token for token
    r.on_report("b", {"outstanding_tokens": 900, "prefill_tokens": 400, "prefix_hashes": h})
    assert r.choose(["a", "b"], h).reason == "spill"  # 400 + 250 > 640


def test_prefill_we_sent_counts_until_the_replica_reports_it():
    clock = Clock()
    r = TokenAwareRouter(block_size=16, min_margin_tokens=0, imbalance_ratio=0.0, clock=clock)
    prompt = list(range(100, 200))
    h = prompt_block_hashes(prompt, 16)
    r.on_report("a", {"outstanding_tokens": 0, "prefix_hashes": h})
    r.on_report("b", {"outstanding_tokens": 0, "prefix_hashes": []})
    clock.t = 1.0
    r.on_sent("a", "miss", [], 520, prefill_tokens=500)  # another tenant's cold prompt
    assert r.books["a"].pressure(0.5) == 500 + 0.5 * 20
    assert r.choose(["a", "b"], h).reason == "spill"  # 510 > 0 + 6 blocks x 16
    clock.t = 1.5  # a report seen this soon may predate the request: it still counts
    r.on_report("a", {"outstanding_tokens": 20, "prefill_tokens": 0, "decode_tokens": 20, "prefix_hashes": h})
    assert r.books["a"].pressure(0.5) == 500 + 10
    clock.t = 2.5
    r.on_report("a", {"outstanding_tokens": 20, "prefill_tokens": 0, "decode_tokens": 20, "prefix_hashes": h})
    assert r.books["a"].pressure(0.5) == 10  # prefilled since: only its decode is left
    assert r.choose(["a", "b"], h).reason == "prefix"


def test_no_prefix_anywhere_goes_by_outstanding_tokens_not_requests():
    r = TokenAwareRouter(block_size=BS)
    r.on_sent("a", "essay", [], 4000)  # one long request
    for i in range(5):
        r.on_sent("b", f"short-{i}", [], 80)  # five short ones
    assert r.choose(["a", "b"], hashes([7] * 20)).replica == "b"
    r.on_done("essay")
    assert r.choose(["a", "b"], hashes([7] * 20)).replica == "a"


def test_own_books_give_affinity_before_any_report_and_forget_on_done():
    clock = Clock()
    r = TokenAwareRouter(block_size=BS, clock=clock, sent_ttl_s=5.0)
    tenant = list(range(100, 140))
    first = r.choose(["a", "b"], hashes(tenant + [1]))
    r.on_sent(first.replica, "r1", hashes(tenant + [1]), 50)
    second = r.choose(["a", "b"], hashes(tenant + [2]))
    assert second.replica == first.replica and second.reason == "prefix"
    assert r.books[first.replica].sent_tokens == 50
    r.on_done("r1")
    assert r.books[first.replica].sent_tokens == 0
    # a report that no longer lists a block we sent long ago: it was evicted there
    clock.t = 10.0
    r.on_report(first.replica, {"outstanding_tokens": 0, "prefix_hashes": []})
    assert r.choose(["a", "b"], hashes(tenant + [3])).matched_blocks == 0


def test_a_retried_request_is_counted_once_and_dead_replicas_are_dropped():
    r = TokenAwareRouter(block_size=BS)
    r.on_sent("a", "x", [], 100)
    r.on_sent("b", "x", [], 100)
    assert r.books["a"].sent_tokens == 0 and r.books["b"].sent_tokens == 100
    r.sync_replicas(["a"])
    assert set(r.books) == {"a"}
    r.on_done("x")  # no error for a request of a replica that is gone


def test_estimate_and_validation():
    assert estimate_tokens(100, 2, 16, 50) == 100 - 32 + 50
    assert estimate_tokens(10, 5, 16, 7) == 7
    with pytest.raises(ValueError):
        TokenAwareRouter(block_size=0)
    with pytest.raises(ValueError):
        TokenAwareRouter().choose([], [])


def test_ray_request_router_shell_ranks_the_policy_choice_first():
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.cluster.router import TokenPrefixRequestRouter

    router = TokenPrefixRequestRouter.__new__(TokenPrefixRequestRouter)  # no Serve machinery
    router.initialize_state(block_size=BS, min_margin_tokens=8, imbalance_ratio=0.0)
    prompt = list(range(30))
    reps = {
        "r1": SimpleNamespace(
            replica_id="r1", routing_stats={"outstanding_tokens": 0, "prefix_hashes": [], "reported_at": 1}
        ),
        "r2": SimpleNamespace(
            replica_id="r2",
            routing_stats={"outstanding_tokens": 10, "prefix_hashes": hashes(prompt), "reported_at": 1},
        ),
        "r3": SimpleNamespace(replica_id="r3", routing_stats={}),
    }
    router._replicas = reps

    def pending(rid: str, method: str = "generate") -> SimpleNamespace:
        meta = SimpleNamespace(call_method=method, internal_request_id=rid)
        return SimpleNamespace(metadata=meta, args=[prompt, {"max_tokens": 10}, rid])

    ranks = asyncio.run(router.choose_replicas(list(reps.values()), pending("q1")))
    assert [[r.replica_id for r in rank] for rank in ranks][0] == ["r2"]
    assert sorted(r[0].replica_id for r in ranks) == ["r1", "r2", "r3"]
    assert router.policy.books["r2"].sent_tokens == 30 - 28 + 10  # 7 blocks of 4 were cached
    router.on_request_completed("r2", "q1")
    assert router.policy.books["r2"].sent_tokens == 0
    ranks = asyncio.run(router.choose_replicas(list(reps.values()), pending("d", "describe")))
    assert ranks[-1][0].replica_id == "r2"  # a non-generate call: least loaded first


def test_a_prefix_evicted_everywhere_goes_back_to_its_home_replica():
    clock = Clock()
    r = TokenAwareRouter(block_size=BS, clock=clock, sent_ttl_s=5.0)
    tenant = list(range(100, 140))
    h = hashes(tenant + [1])
    r.on_sent("b", "r1", h, 10)
    r.on_done("r1")
    clock.t = 10.0  # evicted on b (memory pressure); a is emptier and idle
    r.on_report("a", {"outstanding_tokens": 0, "prefix_hashes": []})
    r.on_report("b", {"outstanding_tokens": 60, "prefill_tokens": 0, "prefix_hashes": []})
    choice = r.choose(["a", "b"], hashes(tenant + [2]))
    assert (choice.replica, choice.reason, choice.matched_blocks) == ("b", "home", 0)
    # the home is not kept against a real overload
    r.on_report("b", {"outstanding_tokens": 900, "prefill_tokens": 900, "prefix_hashes": []})
    assert r.choose(["a", "b"], hashes(tenant + [2])).reason == "least-tokens"
    # sent to both before: no home, the least loaded replica takes it
    r.on_sent("a", "r2", h, 10)
    r.on_done("r2")
    r.on_report("b", {"outstanding_tokens": 60, "prefill_tokens": 0, "prefix_hashes": []})
    assert r.choose(["a", "b"], hashes(tenant + [3])).replica == "a"


def test_a_request_cancelled_before_it_reaches_a_replica_leaves_no_load_behind():
    # Serve calls choose_replicas for a request that then waits (every replica at
    # max_ongoing_requests); a client that gives up cancels it before it is sent anywhere, and
    # Serve never calls on_request_completed for it: its tokens must not stay on the books
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.cluster.router import TokenPrefixRequestRouter

    router = TokenPrefixRequestRouter.__new__(TokenPrefixRequestRouter)
    router.initialize_state(block_size=BS)
    reps = [SimpleNamespace(replica_id=r, routing_stats={}) for r in ("r1", "r2")]
    router._replicas = {r.replica_id: r for r in reps}

    async def go() -> tuple[int, int]:
        future = asyncio.get_running_loop().create_future()
        meta = SimpleNamespace(call_method="generate", internal_request_id="gone")
        pending = SimpleNamespace(metadata=meta, args=[list(range(30)), {"max_tokens": 500}, "gone"],
                                  future=future)
        for _ in range(3):  # routed again while it waits (Serve's backoff loop)
            await router.choose_replicas(reps, pending)
        queued = sum(b.sent_tokens for b in router.policy.books.values())
        future.cancel()
        await asyncio.sleep(0)  # done callbacks run on the next loop turn
        return queued, sum(b.sent_tokens for b in router.policy.books.values())

    queued, left = asyncio.run(go())
    assert queued > 500 and left == 0  # counted once while it waited, gone once cancelled
