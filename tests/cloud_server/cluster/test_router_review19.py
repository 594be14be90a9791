"""The Ray Serve request router shell driven with fake replicas (no Ray started): a malformed
prompt never breaks the routing call, and replicas without a prefix cache get no prefix affinity."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from cloud_server.config import ClusterConfig, EngineConfig

BS = 4


def _router(**kwargs):
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.cluster.router import TokenPrefixRequestRouter

    router = TokenPrefixRequestRouter.__new__(TokenPrefixRequestRouter)  # no Serve machinery
    router.initialize_state(**{"block_size": BS, **kwargs})
    reps = [SimpleNamespace(replica_id=r, routing_stats={}) for r in ("r1", "r2")]
    router._replicas = {r.replica_id: r for r in reps}
    return router, reps


def _pending(rid: str, prompt: list, params: dict) -> SimpleNamespace:
    meta = SimpleNamespace(call_method="generate", internal_request_id=rid)
    return SimpleNamespace(metadata=meta, args=[prompt, params, rid])


@pytest.mark.parametrize(
    ("prompt", "params"),
    [
        ([1, 2, 3, 4, 5.5, 6, 7, 8, 9], {"max_tokens": 4}),  # a float id
        (["a", "b", "c", "d", "e", "f"], {"max_tokens": 4}),  # text where ids go
        ([2**64, 1, 2, 3, 4, 5], {"max_tokens": 4}),  # past 64 bits
        (list(range(9)), {"max_tokens": None}),
        (list(range(9)), {"max_tokens": "lots"}),
        (list(range(9)), {"max_tokens": float("nan")}),
    ],
)
def test_a_malformed_request_is_routed_by_load_not_raised_in_the_router(prompt, params):
    # an exception in choose_replicas ends Serve's routing task: the request then waits for a
    # replica for ever instead of reaching one, which refuses it with a clear error
    router, reps = _router()
    pending = _pending("bad", prompt, params)
    ranks = asyncio.run(router.choose_replicas(reps, pending))
    assert sorted(rank[0].replica_id for rank in ranks) == ["r1", "r2"]
    router.on_request_routed(pending, ranks[0][0].replica_id, None)
    router.on_request_completed(ranks[0][0].replica_id, "bad")
    assert all(b.sent_tokens == 0 for b in router.policy.books.values())


def test_replicas_without_a_prefix_cache_get_no_prefix_affinity():
    # --no-prefix-caching: the replicas cache nothing, but the router's own books said the prompt
    # it sent was cached there and kept a shared system prompt on one replica (the other idle)
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.cluster.app import build_app

    config = EngineConfig("m.gguf", block_size=BS, enable_prefix_caching=False)
    app = build_app(config, ClusterConfig(replicas=2))
    engine = app._bound_deployment.init_args[0]._bound_deployment
    kwargs = dict(engine._deployment_config.request_router_config.request_router_kwargs)
    kwargs.pop("board_name")
    router, reps = _router(**kwargs)
    system = list(range(100, 140))
    first = asyncio.run(router.choose_replicas(reps, _pending("q1", system + [1], {"max_tokens": 8})))
    second = asyncio.run(router.choose_replicas(reps, _pending("q2", system + [2], {"max_tokens": 8})))
    assert first[0][0].replica_id != second[0][0].replica_id  # by load: the idle replica
    assert router.policy.num_prefix_choices == 0
    # the whole prompt is prefilled where it runs: booked in full, no cached blocks assumed
    assert sorted(b.sent_tokens for b in router.policy.books.values()) == [41 + 8, 41 + 8]


class _UnavailableHandle:
    """A deployment handle for an engine deployment that failed to deploy: Serve refuses every
    call before any replica (``DeploymentUnavailableError``)."""

    def options(self, **_):
        return self

    @property
    def generate(self):
        return self

    def remote(self, prompt_ids, params, request_id):
        from ray.serve._private.common import DeploymentID
        from ray.serve.exceptions import DeploymentUnavailableError

        class Stream:
            def __aiter__(self):
                return self._gen()

            async def _gen(self):
                raise DeploymentUnavailableError(DeploymentID(name="hybridllm-engine", app_name="hybridllm"))
                yield  # an async generator

            def cancel(self):
                pass

        return Stream()


def test_an_engine_deployment_that_failed_to_deploy_is_a_503_that_says_so():
    # it was an exception the API layer did not know: an anonymous 500 ("The server had an error
    # while processing your request"), and its log line named only the type
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.api.errors import error_kind
    from cloud_server.cluster.remote_engine import RemoteEngine

    engine = RemoteEngine(_UnavailableHandle(), "m", retries=2)

    async def collect():
        return [o async for o in engine._stream("req", [1, 2], {})]

    with pytest.raises(Exception) as caught:
        asyncio.run(collect())
    assert error_kind(caught.value).status == 503
    assert "failed to start" in str(caught.value)
    assert engine.num_retried == 0  # not sent again: no replica would take it


def test_a_request_that_never_reaches_its_replica_leaves_no_load_once_the_replica_is_idle():
    # Serve chose the replica (the pending future has its result) and the caller was cancelled
    # before the send: Serve calls no on_request_completed for it, and its tokens stayed on the
    # books for ever, the replica busy in the router's eyes while it reported itself idle
    router, reps = _router()
    now = [100.0]
    router.policy._clock = lambda: now[0]

    async def go() -> None:
        future = asyncio.get_running_loop().create_future()
        pending = _pending("lost", list(range(30)), {"max_tokens": 500})
        pending.future = future
        ranks = await router.choose_replicas(reps, pending)
        future.set_result(ranks[0][0])  # assigned; the send never happens
        await asyncio.sleep(0)

    asyncio.run(go())
    (chosen,) = [k for k, b in router.policy.books.items() if b.sent_tokens]
    stamp = [0]

    def report(tokens) -> None:
        stamp[0] += 1
        router._replicas[chosen].routing_stats = {"outstanding_tokens": tokens, "prefix_hashes": [],
                                                  "reported_at": stamp[0]}
        router._refresh()

    report(0)  # just sent: the report may predate its arrival there
    assert router.policy.books[chosen].sent_tokens == 530
    now[0] += 60.0
    report(float("nan"))  # no count: our books carry the load
    report(7)  # busy: it may be running it
    assert router.policy.books[chosen].sent_tokens == 530
    report(0)  # idle, a minute after the send: the request is not there
    assert router.policy.books[chosen].sent_tokens == 0
    assert router.policy._request_replica == {}
    router.on_request_completed(chosen, "lost")  # a late end changes nothing
    assert all(b.sent_tokens == 0 for b in router.policy.books.values())


@pytest.mark.parametrize("rejection_ends_first", [True, False])
def test_a_replica_that_turned_a_request_away_is_not_taken_for_its_prefix_or_its_home(rejection_ends_first):
    # a new tenant's request is booked on b (least loaded); b is full and turns it away, a runs
    # it. b's books kept the prompt's blocks: b looked as if it held the tenant's prefix, and,
    # once evicted everywhere, the tenant had two homes (a tie: no home at all)
    from cloud_server.cluster.policy import TokenAwareRouter, prompt_block_hashes

    clock = [0.0]
    r = TokenAwareRouter(block_size=BS, clock=lambda: clock[0], sent_ttl_s=5.0)
    tenant = list(range(100, 140))
    h = prompt_block_hashes(tenant + [1], BS)
    r.on_report("a", {"outstanding_tokens": 50, "prefix_hashes": []})
    r.on_report("b", {"outstanding_tokens": 0, "prefix_hashes": []})
    assert r.choose(["a", "b"], h).replica == "b"
    r.on_sent("b", "q1", h, 51, prefill_tokens=41, reason="least-tokens")
    clock[0] = 0.5
    if rejection_ends_first:
        r.on_done("q1", "b")
        r.on_routed("a", "q1", h, 41, 10)
    else:
        r.on_routed("a", "q1", h, 41, 10)
        r.on_done("q1", "b")
    assert not any(r.books["b"].holds(x) for x in h) and not any(x in r.books["b"].history for x in h)
    assert all(r.books["a"].holds(x) for x in h)
    r.on_done("q1", "a")
    # a evicted it too (memory pressure); b is idle: the tenant goes home to a, which ran it
    clock[0] = 10.0
    r.on_report("a", {"outstanding_tokens": 40, "prefill_tokens": 0, "prefix_hashes": []})
    r.on_report("b", {"outstanding_tokens": 0, "prefix_hashes": []})
    choice = r.choose(["a", "b"], prompt_block_hashes(tenant + [2], BS))
    assert (choice.replica, choice.reason) == ("a", "home")


def test_a_request_cancelled_before_its_send_leaves_its_prompt_on_no_replica():
    # cancelled while it waited for a free replica: its tokens left the books, its prompt's
    # blocks stayed on the replica it was booked on, taken there for a cached prefix and a home
    from cloud_server.cluster.policy import prompt_block_hashes

    router, reps = _router()
    h = prompt_block_hashes(list(range(100, 140)), BS)
    router.policy.on_sent("r1", "x", h[:5], 30)  # another request's blocks, sent before

    async def go() -> None:
        future = asyncio.get_running_loop().create_future()
        pending = _pending("q", list(range(100, 140)), {"max_tokens": 8})
        pending.future = future
        for _ in range(2):  # routed again while it waits
            await router.choose_replicas(reps, pending)
        future.cancel()
        await asyncio.sleep(0)

    asyncio.run(go())
    books = router.policy.books
    assert all(b.sent_tokens == 0 for k, b in books.items() if k != "r1")
    assert not any(b.holds(x) or x in b.history for b in books.values() for x in h[5:])
    assert all(books["r1"].holds(x) for x in h[:5])  # another request's blocks stay
