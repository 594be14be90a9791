"""The cloud budget under concurrency: reserve-then-settle, so N requests at once cannot all spend
the last call; reservations released on every path that made no cloud call; a broken call
counted with its prompt."""

from __future__ import annotations

import asyncio
import threading

import pytest

from hybridllm import AsyncHybridLLM, CloudAuthError, CloudUnavailableError, Decision, HybridLLM
from hybridllm._types import Usage, last_user_text
from hybridllm.backends.base import Delta
from hybridllm.backends.fake import FakeBackend
from hybridllm.router.budget import Budget
from tests._open_clients import close_clients_left_open  # noqa: F401 - an autouse fixture


class CloudRouter:
    """'hard' -> the cloud; anything else the device; 'unsure' -> edge first (cascade)."""

    def decide(self, msgs, *, force=None, prompt_tokens=None, embedding=None):
        text = last_user_text(msgs)
        if force:
            return Decision(force, f"forced {force}", None, msgs, forced=True)
        if "unsure" in text:
            return Decision("edge", "borderline", 0.5, msgs, cascade=True)
        return Decision("cloud" if "hard" in text else "edge", "score", 0.9, msgs)

    def should_escalate(self, lp):
        return True


class WaitingCloud(FakeBackend):
    """A cloud that takes its time (awaited, so all requests are in flight together): up to
    ``wait_s``, or until ``go`` is set."""

    def __init__(self, wait_s: float = 0.5, fail: Exception | None = None) -> None:
        super().__init__(model="cloud-model", reply=lambda m: "cloud says hi")
        self.wait_s, self.fail, self.started = wait_s, fail, 0
        self.go = asyncio.Event()

    async def astream(self, messages, params, **kw):
        self.started += 1
        try:
            await asyncio.wait_for(self.go.wait(), self.wait_s)
        except TimeoutError:
            pass
        if self.fail is not None:
            raise self.fail
        yield Delta("cloud says")
        yield Delta(" hi")
        yield Delta("", finish_reason="stop", usage=Usage(30, 2))


def make(cloud, **budget):
    edge = FakeBackend(model="edge-model", reply=lambda m: "device answer")
    return HybridLLM(edge=edge, cloud=cloud, policy=CloudRouter(), cache=False, **budget), edge


async def _together(allm, cloud, prompts, **options):
    """The requests at once; the cloud's call ends only when all but one have their answer (or
    after its wait), so every request is planned while that call is in flight."""
    tasks = [asyncio.create_task(allm.chat(p, **options)) for p in prompts]
    pending = set(tasks)
    while pending:
        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if len(pending) <= 1:
            cloud.go.set()
    return [t.result() for t in tasks]


def test_with_one_call_left_one_of_eight_concurrent_requests_reaches_the_cloud():
    cloud = WaitingCloud()
    llm, _ = make(cloud, max_cloud_calls_per_hour=1)
    out = asyncio.run(_together(AsyncHybridLLM.wrap(llm), cloud, [f"hard question {i}" for i in range(8)]))
    assert cloud.started == 1
    assert sorted(c.route for c in out) == ["cloud"] + ["edge"] * 7
    for c in out:
        if c.route == "edge":
            assert "budget spent: 1/1 cloud calls this hour" in c.reason, c.reason
    usage = llm.stats()["budget"]
    assert usage["calls_hour"] == 1 and usage["tokens_hour"] == 32 and usage["calls_in_flight"] == 0


def test_a_token_budget_reserves_the_estimate():
    # each request reserves its prompt (7 tokens for the fake edge) plus max_tokens (20): 27. A
    # limit of 27 holds one such call, so 1 of 8 goes; settled at the cloud's own 32 tokens
    cloud = WaitingCloud()
    llm, _ = make(cloud, max_cloud_tokens_per_day=27)
    prompts = [f"hard question {i}" for i in range(8)]
    out = asyncio.run(_together(AsyncHybridLLM.wrap(llm), cloud, prompts, max_tokens=20))
    assert cloud.started == 1 and sorted(c.route for c in out) == ["cloud"] + ["edge"] * 7
    spent = [c.reason for c in out if c.route == "edge"]
    assert all("budget spent: 27/27 cloud tokens today (1 in flight)" in r for r in spent), spent
    assert llm.stats()["budget"]["tokens_day"] == 32  # the count, not the estimate


def test_the_estimate_gives_way_to_the_real_count():
    # a limit of 40: one call reserves 7 + 50 = 57 and settles at the 32 it used, so the next one
    # still fits (32 < 40; had the estimate stayed, 57 would not)
    cloud = WaitingCloud(wait_s=0.0)
    llm, _ = make(cloud, max_cloud_tokens_per_day=40)
    routes = [llm.chat(f"hard question {i}", max_tokens=50).route for i in range(3)]
    assert routes == ["cloud", "cloud", "edge"]  # then 64 >= 40: spent


@pytest.mark.parametrize(
    "failure", [CloudUnavailableError("connection refused"), CloudAuthError("bad key", status_code=401)],
    ids=["falls-back-to-the-device", "raises"],
)
def test_a_request_that_made_no_cloud_call_releases_its_reservation(failure):
    cloud = WaitingCloud(wait_s=0.0, fail=failure)
    llm, _ = make(cloud, max_cloud_calls_per_hour=1)
    for _ in range(2):  # the first reservation was given back: the second request may try too
        try:
            assert llm.chat("hard question").route == "edge (cloud unavailable)"
        except CloudAuthError:
            pass
    assert cloud.started == 2
    assert llm.stats()["budget"] == {"calls_hour": 0, "calls_day": 0, "tokens_hour": 0, "tokens_day": 0,
                                     "calls_in_flight": 0}


def test_a_cancelled_request_releases_its_reservation():
    cloud = WaitingCloud(wait_s=5.0)
    llm, _ = make(cloud, max_cloud_calls_per_hour=1)
    allm = AsyncHybridLLM.wrap(llm)

    async def run():
        task = asyncio.create_task(allm.chat("hard question"))
        while cloud.started == 0:
            await asyncio.sleep(0.01)
        assert llm.stats()["budget"]["calls_in_flight"] == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cloud.wait_s = 0.0
        return await allm.chat("hard question")

    # the cancelled call was sent (the cloud read its prompt): it counts, and holds nothing more
    assert asyncio.run(run()).route == "edge"
    assert llm.stats()["budget"]["calls_hour"] == 1 and llm.stats()["budget"]["calls_in_flight"] == 0


def test_a_cascade_reserves_only_when_it_escalates():
    cloud = WaitingCloud()
    llm, _ = make(cloud, max_cloud_calls_per_hour=1)
    out = asyncio.run(_together(AsyncHybridLLM.wrap(llm), cloud, [f"unsure question {i}" for i in range(4)]))
    assert cloud.started == 1
    assert sorted(c.route for c in out) == ["edge"] * 3 + ["edge->cloud"]
    assert all("budget spent" in c.reason for c in out if c.route == "edge")


class BreakingCloud(FakeBackend):
    """Streams two words, then the connection drops."""

    def __init__(self) -> None:
        super().__init__(model="cloud-model", reply=lambda m: "the cloud begins here and goes on")

    def stream(self, messages, params):
        for i, delta in enumerate(super().stream(messages, params)):
            if i == 2:
                raise CloudUnavailableError("connection reset mid-stream")
            yield delta


def test_a_broken_call_counts_its_prompt_and_what_it_streamed():
    edge = FakeBackend(model="edge-model", reply=lambda m: "and the rest")
    llm = HybridLLM(edge=edge, cloud=BreakingCloud(), policy=CloudRouter(), cache=False,
                    max_cloud_tokens_per_day=10_000)
    messages = [{"role": "user", "content": "a hard question"}]
    c = llm.chat(messages)
    assert c.route == "cloud->edge"
    prompt = edge.count_tokens(messages)  # 7: the device's count
    # plus the two words streamed, "the" and " cloud": ceil(3 / 4) + ceil(6 / 4) tokens
    assert llm.stats()["budget"]["tokens_day"] == prompt + 1 + 2


def test_a_call_abandoned_mid_stream_counts_its_prompt_too():
    cloud = FakeBackend(model="cloud-model", reply=lambda m: "a long cloud answer " * 10)
    llm, edge = make(cloud, max_cloud_tokens_per_day=10_000)
    for i, _chunk in enumerate(llm.stream("hard question")):
        if i == 1:
            break
    usage = llm.stats()["budget"]
    assert usage["calls_day"] == 1 and usage["tokens_day"] >= edge.count_tokens(
        [{"role": "user", "content": "hard question"}]) + 2


# --- the ledger itself ---------------------------------------------------------------------------


def test_reservations_from_many_threads_never_pass_the_limit():
    b = Budget(max_cloud_calls_per_hour=3)
    held, barrier = [], threading.Barrier(16)

    def take():
        barrier.wait()
        r, _ = b.reserve(10)
        if r is not None:
            held.append(r)

    threads = [threading.Thread(target=take) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(held) == 3
    reservation, spent = b.reserve(10)
    assert reservation is None and spent == "budget spent: 3/3 cloud calls this hour (3 in flight)"
    b.release(held[0])
    b.release(held[0])  # twice: harmless
    b.settle(held[1], 40)
    assert b.usage()["calls_hour"] == 1 and b.usage()["tokens_hour"] == 40
    assert b.usage()["calls_in_flight"] == 1
    assert b.reserve(10)[0] is not None  # room again for one


class SilentCloud(FakeBackend):
    """A server that sends no usage with its answer."""

    def stream(self, messages, params):
        yield Delta("cloud says")
        yield Delta(" hi")
        yield Delta("", finish_reason="stop", usage=Usage())


def test_a_call_whose_server_sends_no_usage_still_counts():
    llm, edge = make(SilentCloud(model="cloud-model"), max_cloud_calls_per_hour=1)
    assert llm.chat("hard question").route == "cloud"
    usage = llm.stats()["budget"]
    prompt = edge.count_tokens([{"role": "user", "content": "hard question"}])
    # its prompt (the device's count) plus the text it streamed, ~4 characters a token a piece,
    # rounded up ("cloud says": ceil(10 / 4) = 3, " hi": 1)
    assert usage["calls_hour"] == 1 and usage["tokens_hour"] == prompt + 3 + 1
    assert llm.chat("hard question 2").route == "edge"  # the one call was spent


@pytest.mark.real
def test_a_broken_call_is_counted_with_the_real_device_tokenizer(smollm2_path):
    from hybridllm.backends.base import create_backend

    edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=512, n_threads=1)
    with HybridLLM(edge=edge, cloud=BreakingCloud(), policy=CloudRouter(), cache=False, max_tokens=8,
                   temperature=0.0, max_cloud_tokens_per_day=10_000) as llm:
        messages = [{"role": "user", "content": "a hard question: why is the sky blue?"}]
        c = llm.chat(messages)
        assert c.route == "cloud->edge" and c.text.startswith("the cloud")  # the device finished it
        prompt = edge.count_tokens(messages)  # SmolLM2's own count, its chat template included
        assert prompt > 10
        assert llm.stats()["budget"]["tokens_day"] == prompt + 1 + 2  # "the", " cloud": ceil(n / 4)
