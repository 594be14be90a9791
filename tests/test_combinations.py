"""Features that landed together, used together, on fakes (fast): privacy="redact" with a cloud
stream that breaks mid-answer, a cascade, the cache and the proxy; the device's context window
with a broken cloud stream; the budget's reservations however a request ends; the cost of an
answer the device finished. The real SmolLM2 and cloud server versions are in
e2e/test_combinations_real.py."""

from __future__ import annotations

import asyncio
import gc

import pytest

from hybridllm import (
    AsyncHybridLLM,
    CloudBudgetSpentError,
    CloudUnavailableError,
    ContextWindowExceededError,
    Decision,
    HybridLLM,
)
from hybridllm.backends.base import Delta
from hybridllm.backends.fake import FakeBackend
from hybridllm.router import Budget, RoutingPolicy

from .test_context_window import Cloud, WordDevice
from .test_pii_restore import PROMPT, EchoCloud, HardRouter, StoringCache

PRICE = 0.002  # per 1k tokens


class CloudRouter:
    """Every prompt goes to the cloud (no privacy)."""

    def decide(self, msgs, *, force=None, prompt_tokens=None, embedding=None):
        if force:
            return Decision(force, f"forced {force} by the caller", None, msgs, forced=True)
        return Decision("cloud", "score 0.900 >= threshold 0.500", 0.9, msgs)

    def should_escalate(self, lp):
        return True


class BreakingCloud(Cloud):
    """Streams ``pieces`` exactly as given, then the connection drops."""

    def __init__(self, pieces):
        super().__init__()
        self.pieces = pieces

    def stream(self, messages, params):
        self.calls.append(messages)
        for p in self.pieces:
            yield Delta(p)
        raise CloudUnavailableError("connection reset")


def budget(llm) -> dict:
    return llm.stats()["budget"]


# --- a broken cloud stream whose answer so far does not fit the device beside the prompt ---------

FITS = "word " * 27  # 31 tokens for WordDevice: fits its context of 32 by one answer token


def overflowing_client() -> HybridLLM:
    # the prompt fits the device, but prompt + the 5 words the cloud streamed (36) do not
    return HybridLLM(edge=WordDevice(), cloud=BreakingCloud(["a b c d e"]), policy=CloudRouter(),
                     cache=False, max_cloud_calls_per_hour=10)


def test_a_broken_stream_the_device_cannot_finish_is_a_cloud_failure_not_a_too_long_prompt():
    llm = overflowing_client()
    with pytest.raises(CloudUnavailableError) as info:
        llm.chat(FITS)
    err = info.value
    assert not isinstance(err, ContextWindowExceededError)  # the caller's prompt was fine
    assert "stream broke" in str(err) and "retry" in str(err)
    assert "31 tokens" in str(err) and "n_ctx 32" in str(err)
    assert "cloud_url" not in str(err)  # a cloud is configured: the device's own advice is wrong
    with pytest.raises(CloudUnavailableError, match="cannot finish the answer"):
        list(llm.stream(FITS))

    async def run():
        with pytest.raises(CloudUnavailableError, match="cannot finish the answer"):
            await AsyncHybridLLM.wrap(llm).chat(FITS)

    asyncio.run(run())
    assert budget(llm)["calls_in_flight"] == 0 and budget(llm)["calls_hour"] == 3
    llm.close()


def test_the_proxy_reports_that_broken_stream_in_band_as_the_cloud_unavailable():
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    llm = overflowing_client()
    body = {"model": "x", "messages": [{"role": "user", "content": FITS}], "stream": True}
    with TestClient(create_app(llm)) as http:
        r = http.post("/v1/chat/completions", json=body)
        plain = http.post("/v1/chat/completions", json={**body, "stream": False})
    llm.close()
    assert r.status_code == 200 and "a b c d e" in r.text  # the chunk the cloud sent went out
    assert "context_length_exceeded" not in r.text and "upstream_unavailable" in r.text
    assert plain.status_code == 503 and plain.json()["error"]["type"] == "upstream_unavailable"


def test_a_prompt_too_long_for_the_device_still_says_so_when_the_stream_breaks():
    # a prompt the device cannot hold at all: the numbers, and a retry (the cloud takes it)
    llm = HybridLLM(edge=WordDevice(), cloud=BreakingCloud(["a b"]), policy=CloudRouter(), cache=False)
    with pytest.raises(CloudUnavailableError, match="stream broke off mid-answer") as info:
        llm.chat("word " * 40)
    assert (info.value.prompt_tokens, info.value.context_length) == (44, 32)
    llm.close()


# --- privacy="redact" with a broken stream, a cascade, the cache, the proxy ------------------------


def redacting(cloud, *, edge_reply="and more", cache=False, policy=None, **settings):
    edge = FakeBackend(model="edge-model", reply=lambda m: edge_reply)
    policy = policy or RoutingPolicy(HardRouter(), privacy="redact")
    llm = HybridLLM(edge=edge, cloud=cloud, policy=policy, cache=cache,
                    price_per_1k_tokens=PRICE, **settings)
    return llm, edge


def test_redact_and_a_broken_stream_the_device_continues_from_the_restored_text():
    cloud = BreakingCloud(["Mail [EMAIL_1] and ", "EMAIL_2 now."])
    llm, edge = redacting(cloud, max_cloud_calls_per_hour=10)
    stream = llm.stream(PROMPT)
    chunks = [ch.text for ch in stream]
    c = stream.completion
    restored = "Mail jane.doe@example.com and bob@example.org now."
    assert c.route == "cloud->edge" and c.text == f"{restored} and more"
    assert "".join(chunks) == c.text and not any("EMAIL" in ch for ch in chunks)
    # the device (local) reads the values, never a placeholder; the cloud never reads a value
    assert edge.continued == [restored]
    assert "example" not in repr(cloud.calls) and "EMAIL_1" in repr(cloud.calls)
    assert "jane.doe" not in c.reason
    assert budget(llm)["calls_in_flight"] == 0 and budget(llm)["calls_hour"] == 1
    llm.close()


def test_an_answer_the_device_finished_costs_its_cloud_call():
    cloud = BreakingCloud(["Mail [EMAIL_1] and ", "EMAIL_2 now."])
    llm, _ = redacting(cloud, max_cloud_calls_per_hour=10)
    c = llm.chat(PROMPT)
    spent = budget(llm)["tokens_hour"]  # the ledger: prompt + what the cloud streamed
    assert c.route == "cloud->edge" and spent > 0
    assert c.cost_usd == pytest.approx(spent / 1000 * PRICE)  # was 0.0
    assert llm.stats()["cloud_cost_usd"] == pytest.approx(spent / 1000 * PRICE, abs=1e-6)
    llm.close()


def test_redact_and_a_cascade_that_escalates_and_then_breaks():
    class Borderline(HardRouter):
        threshold = 0.95

    policy = RoutingPolicy(Borderline(), privacy="redact", cascade_band=(0.8, 0.95))
    cloud = BreakingCloud(["Ask [EMAIL_2] first, "])
    edge = FakeBackend(model="edge-model", reply=lambda m: "then wait.", logprob=-5.0)
    llm = HybridLLM(edge=edge, cloud=cloud, policy=policy, cache=False, price_per_1k_tokens=PRICE,
                    max_cloud_calls_per_hour=10)
    c = llm.chat(PROMPT)
    assert c.route == "edge->cloud->edge" and c.text.startswith("Ask bob@example.org first, ")
    assert "EMAIL" not in c.text and "example" not in repr(cloud.calls)
    assert edge.continued == ["Ask bob@example.org first, "]
    assert c.cost_usd > 0 and budget(llm)["calls_in_flight"] == 0
    llm.close()


def test_redact_and_a_continued_stream_is_restored_and_not_stored():
    """The device finished the cloud's answer in its place: not stored (the cloud's whole answer is,
    once it answers), so asked again the cloud is asked again; both answers restored."""
    cache = StoringCache()
    llm, _ = redacting(BreakingCloud(["Mail [EMAIL_1] "]), cache=cache, max_cloud_calls_per_hour=10)
    first = llm.chat(PROMPT)
    again = llm.chat(PROMPT)
    assert first.route == "cloud->edge" and again.route == "cloud->edge" and again.text == first.text
    assert "EMAIL" not in again.text and "jane.doe@example.com" in again.text
    assert budget(llm)["calls_hour"] == 2 and budget(llm)["calls_in_flight"] == 0
    llm.close()


def test_redact_through_the_proxy_stream_with_include_usage():
    pytest.importorskip("fastapi")
    import json

    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    llm, _ = redacting(EchoCloud(pieces=["cc [EMAIL", "_2] please"]), max_cloud_calls_per_hour=10)
    body = {"model": "x", "messages": [{"role": "user", "content": PROMPT}], "stream": True,
            "stream_options": {"include_usage": True}}
    with TestClient(create_app(llm)) as http:
        r = http.post("/v1/chat/completions", json=body)
        stats = http.get("/stats").json()
    llm.close()
    events = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text == "cc bob@example.org please" and "EMAIL" not in r.text
    assert "usage" in events[-1] and events[-1]["choices"] == []
    assert stats["budget"]["calls_in_flight"] == 0 and stats["budget"]["calls_hour"] == 1


# --- the budget's reservations, however a request ends ------------------------------------------


def slow_cloud_client(**kw):
    cloud = EchoCloud()
    cloud.reply = lambda m: "a long answer " * 20
    return HybridLLM(edge=FakeBackend(model="edge-model"), cloud=cloud, policy=CloudRouter(),
                     max_cloud_calls_per_hour=100, **kw)


def test_a_sync_stream_left_half_way_or_collected_releases_its_reservation():
    llm = slow_cloud_client(cache=False)
    for _ch in llm.stream("hi"):
        break
    assert budget(llm)["calls_in_flight"] == 0
    stream = llm.stream("hi")
    it = iter(stream)
    next(it)
    assert budget(llm)["calls_in_flight"] == 1  # held while it is read
    del it, stream
    gc.collect()
    usage = budget(llm)
    assert usage["calls_in_flight"] == 0 and usage["calls_hour"] == 2 and usage["tokens_hour"] > 0
    llm.close()


def test_async_streams_abandoned_or_cancelled_release_their_reservations():
    llm = slow_cloud_client(cache=False)

    async def run():
        a = AsyncHybridLLM.wrap(llm)
        async with a.stream("hi") as s:
            async for _ch in s:
                break
        assert budget(llm)["calls_in_flight"] == 0
        task = asyncio.ensure_future(a.chat("hi"))
        while budget(llm)["calls_in_flight"] == 0:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert budget(llm)["calls_in_flight"] == 0

    asyncio.run(run())
    llm.close()


def test_a_cache_hit_and_a_failing_policy_hold_nothing():
    cache = StoringCache()
    llm = slow_cloud_client(cache=cache)
    llm.chat("hi")
    assert llm.chat("hi").route == "cache"
    assert budget(llm) == {**budget(llm), "calls_hour": 1, "calls_in_flight": 0}

    class Broken(CloudRouter):
        def decide(self, msgs, **kw):
            raise RuntimeError("router crashed")

    llm._core.policy = Broken()
    with pytest.raises(RuntimeError):
        llm.chat("something else")
    assert budget(llm)["calls_in_flight"] == 0
    llm.close()


def test_last_budget_call_with_a_long_prompt_and_a_broken_stream():
    # one call left: the long prompt takes it; its broken stream is counted; the next long prompt
    # fails clearly instead of reaching a device that cannot hold it
    llm = HybridLLM(edge=WordDevice(), cloud=BreakingCloud(["a b"]), policy=CloudRouter(),
                    cache=False, max_cloud_calls_per_hour=1)
    with pytest.raises(CloudUnavailableError, match="stream broke off"):
        llm.chat("word " * 40)
    with pytest.raises(CloudBudgetSpentError, match="budget spent: 1/1"):
        llm.chat("word " * 40)
    assert budget(llm)["calls_in_flight"] == 0 and budget(llm)["calls_hour"] == 1
    llm.close()


def test_a_shared_budget_object_is_settled_once_per_request():
    ledger = Budget(max_cloud_tokens_per_day=100_000)
    llm = slow_cloud_client(cache=False)
    llm._core.ledger = ledger
    c = llm.chat("hi")
    assert ledger.usage()["tokens_day"] == c.usage.total_tokens and ledger.usage()["calls_day"] == 1
    llm.close()


# --- the device's context window with redact, a cascade and the cache ----------------------------

LONG = "word " * 40  # 44 tokens for WordDevice: past its context of 32


def test_a_long_prompt_with_pii_under_redact_goes_to_the_cloud_redacted_and_comes_back_restored():
    cloud = EchoCloud()
    llm = HybridLLM(edge=WordDevice(), cloud=cloud, policy=RoutingPolicy(HardRouter(), privacy="redact"),
                    cache=False)
    prompt = "mail jo@example.com " + LONG
    c = llm.chat(prompt)
    assert c.route == "cloud" and c.text == f"you said: {prompt}"
    assert "too long for the device" in c.reason and "email redacted for the cloud" in c.reason
    assert "jo@example.com" not in repr(cloud.calls)
    llm.close()


def test_a_long_prompt_is_never_cascaded_and_a_cached_one_replays_without_the_cloud():
    class Borderline(HardRouter):
        threshold = 0.95

    cloud = Cloud()
    cache = StoringCache()
    llm = HybridLLM(edge=WordDevice(), cloud=cloud, cache=cache,
                    policy=RoutingPolicy(Borderline(), privacy="redact", cascade_band=(0.8, 0.95)))
    c = llm.chat(LONG, cascade=True)
    assert c.route == "cloud" and "too long for the device" in c.reason and not llm.edge.generated
    cloud.up = False  # the cloud is gone: the cached answer still needs no device context
    again = llm.chat(LONG, cascade=True)
    assert again.route == "cache" and again.text == "cloud answer"
    llm.close()


def test_a_broken_redacted_stream_is_counted_by_what_the_cloud_sent_not_by_the_restored_values():
    # the ledger's estimate of a call without the cloud's own count is its prompt plus what the
    # cloud streamed (~4 characters a token): the placeholders it wrote, not the (longer) values
    # the user reads after restoring
    piece = "Mail [EMAIL_1] and [EMAIL_2] now."
    llm, edge = redacting(BreakingCloud([piece]), max_cloud_calls_per_hour=10)
    c = llm.chat(PROMPT)
    assert c.text.startswith("Mail jane.doe@example.com and bob@example.org now.")
    prompt = edge.count_tokens([{"role": "user", "content": PROMPT}])
    # the 33 characters sent: ceil(33 / 4) = 9 tokens (the restored 50 would be 13)
    assert len(piece) == 33 and budget(llm)["tokens_hour"] == prompt + 9
    llm.close()


def test_a_stream_left_during_the_devices_continuation_still_settles_the_broken_call():
    # the sync client continues on the reading thread (InlineRun); the async one on the device's
    llm, _ = redacting(BreakingCloud(["Mail [EMAIL_1] and "]), edge_reply="a b c d e f g h",
                       max_cloud_calls_per_hour=10)
    stream = llm.stream(PROMPT)
    it = iter(stream)
    assert [next(it).text for _ in range(3)] == ["Mail jane.doe@example.com and ", " a", " b"]
    assert budget(llm)["calls_in_flight"] == 1
    del it, stream
    gc.collect()
    assert budget(llm)["calls_in_flight"] == 0 and budget(llm)["calls_hour"] == 1

    async def run():
        n = 0
        async with AsyncHybridLLM.wrap(llm).stream(PROMPT) as s:
            async for _ch in s:
                n += 1
                if n == 3:
                    break

    asyncio.run(run())
    assert budget(llm)["calls_in_flight"] == 0 and budget(llm)["calls_hour"] == 2
    llm.close()
