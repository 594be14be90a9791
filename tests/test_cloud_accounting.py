"""One cloud call's accounting, on fakes (fast): what an answer the device finished costs and
counts (the ledger, ``stats()``, ``Completion.usage``), a placeholder the cloud stream broke off
half way (privacy="redact"), a call the caller cancelled before its first token, and a prompt too
long for the device whose cloud cannot take it now (a retry, not a shorter prompt). The real
SmolLM2 with a real HTTP cloud that breaks is in e2e/test_cloud_accounting_real.py."""

from __future__ import annotations

import asyncio

import pytest

from hybridllm import (
    AsyncHybridLLM,
    CloudBudgetSpentError,
    CloudRateLimitError,
    CloudUnavailableError,
    ContextWindowExceededError,
    HybridLLM,
)
from hybridllm.backends.base import Delta
from hybridllm.backends.fake import FakeBackend
from hybridllm.router import RoutingPolicy

from .test_combinations import BreakingCloud, CloudRouter
from .test_context_window import LONG, Cloud, WordDevice
from .test_context_window import client as long_prompt_client
from .test_pii_restore import PROMPT, HardRouter

PRICE = 0.002  # per 1k tokens
SHORT = "hello there"  # 6 tokens for WordDevice (2 words + 4 a message)
JANE, BOB = "jane.doe@example.com", "bob@example.org"  # PROMPT's [EMAIL_1], [EMAIL_2]


def budget(llm) -> dict:
    return llm.stats()["budget"]


def read(llm, how: str, prompt: str) -> tuple[list[str], object]:
    """The chunks' texts and the completion, by ``chat``, the sync stream (its device part on the
    reading thread) or the async stream (its device part on the device's thread)."""
    if how == "chat":
        c = llm.chat(prompt)
        return [c.text], c
    if how == "stream":
        stream = llm.stream(prompt)
        return [ch.text for ch in stream], stream.completion

    async def run():
        async with AsyncHybridLLM.wrap(llm).stream(prompt) as s:
            texts = [ch.text async for ch in s]
        return texts, s.completion

    return asyncio.run(run())


PATHS = ["chat", "stream", "async"]


# --- an answer the device finished: the cloud's cost, and the whole answer's usage ----------------


@pytest.mark.parametrize("how", PATHS)
def test_a_continued_answer_counts_its_cloud_call_once_and_its_whole_answer_in_usage(how):
    # the cloud streams 9 characters (3 tokens, ~4 characters a token rounded up: ceil(9 / 4)) and
    # breaks; WordDevice writes 2 tokens on
    llm = HybridLLM(edge=WordDevice(), cloud=BreakingCloud(["abcdefgh "]), policy=CloudRouter(),
                    cache=False, price_per_1k_tokens=PRICE, max_cloud_tokens_per_day=10_000)
    texts, c = read(llm, how, SHORT)
    s = llm.stats()
    assert c.route == "cloud->edge" and c.text == "abcdefgh device answer" == "".join(texts)
    assert s["budget"]["tokens_day"] == 6 + 3  # the ledger: the prompt plus what the cloud streamed
    # cloud tokens are what the cloud call cost, not the device's continuation on top
    assert s["cloud_tokens"] == 9
    assert c.cost_usd == pytest.approx(9 / 1000 * PRICE)
    assert s["cloud_cost_usd"] == pytest.approx(9 / 1000 * PRICE, abs=1e-6)
    # the answer the caller got: the prompt once; the cloud's 3 tokens and the device's 2
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (6, 5)
    llm.close()


def test_a_whole_cloud_answer_is_counted_as_before():
    llm = HybridLLM(edge=WordDevice(), cloud=Cloud(), policy=CloudRouter(), cache=False,
                    price_per_1k_tokens=PRICE, max_cloud_tokens_per_day=10_000)
    c = llm.chat(SHORT)
    s = llm.stats()
    assert c.route == "cloud" and c.usage.total_tokens > 0
    assert s["cloud_tokens"] == c.usage.total_tokens == s["budget"]["tokens_day"]
    assert c.cost_usd == pytest.approx(c.usage.total_tokens / 1000 * PRICE)
    llm.close()


# --- privacy="redact": a stream that breaks inside a placeholder ---------------------------------


def redacting(cloud, reply: str):
    edge = FakeBackend(model="edge-model", reply=lambda m: reply)
    llm = HybridLLM(edge=edge, cloud=cloud, policy=RoutingPolicy(HardRouter(), privacy="redact"),
                    cache=False, max_cloud_calls_per_hour=10)
    return llm, edge


@pytest.mark.parametrize("how", PATHS)
def test_half_a_placeholder_the_stream_broke_off_never_reaches_the_caller(how):
    llm, edge = redacting(BreakingCloud(["Sure. I will write to [EMA"]), "today.")
    texts, c = read(llm, how, PROMPT)
    assert c.route == "cloud->edge"
    assert "[EMA" not in "".join(texts) and "EMA" not in c.text and "".join(texts) == c.text
    assert c.text.split() == ["Sure.", "I", "will", "write", "to", "today."]
    assert edge.continued == ["Sure. I will write to "]  # the device writes on from what was shown
    assert budget(llm)["calls_hour"] == 1 and budget(llm)["calls_in_flight"] == 0
    llm.close()


def test_a_whole_name_held_back_at_the_break_is_restored_and_continued():
    # a bare EMAIL_1 is held (it might have become EMAIL_12); the break shows it restored
    llm, edge = redacting(BreakingCloud(["Write to EMAIL_1"]), "now.")
    c = llm.chat(PROMPT)
    assert c.route == "cloud->edge" and c.text.startswith(f"Write to {JANE}")
    assert edge.continued == [f"Write to {JANE}"]
    llm.close()


@pytest.mark.parametrize("how", PATHS)
def test_the_devices_continuation_is_restored_too(how):
    # a device repeating placeholders (from the streamed text, or in a bare form last, which the
    # restorer holds until the answer ends): the caller sees the values
    llm, _ = redacting(BreakingCloud(["Mail [EMAIL_1] "]), "and cc [EMAIL_2] and EMAIL_1")
    texts, c = read(llm, how, PROMPT)
    assert c.route == "cloud->edge" and "".join(texts) == c.text
    assert "EMAIL" not in c.text and not any("EMAIL" in t for t in texts)
    assert c.text.split() == ["Mail", JANE, "and", "cc", BOB, "and", JANE]
    llm.close()


# --- a call the caller stops before its first token ----------------------------------------------


class SilentCloud(FakeBackend):
    """Takes the request and sends nothing until ``go`` (a cloud busy with a long prefill)."""

    def __init__(self) -> None:
        super().__init__(model="cloud-model")
        self.started = 0
        self.go = asyncio.Event()

    async def astream(self, messages, params, **kw):
        self.started += 1
        await self.go.wait()
        yield Delta("late")
        yield Delta("", finish_reason="stop")


def test_a_call_cancelled_before_its_first_token_counts_its_prompt():
    cloud = SilentCloud()
    llm = HybridLLM(edge=WordDevice(), cloud=cloud, policy=CloudRouter(), cache=False,
                    max_cloud_tokens_per_day=10_000)

    async def run():
        task = asyncio.ensure_future(AsyncHybridLLM.wrap(llm).chat(SHORT))
        while not cloud.started:
            await asyncio.sleep(0.01)
        assert budget(llm)["calls_in_flight"] == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    # the request went out and the cloud read the prompt: it counts, as a broken call does
    assert budget(llm) == {**budget(llm), "calls_day": 1, "tokens_day": 6, "calls_in_flight": 0}
    llm.close()


def test_a_call_that_failed_before_answering_still_costs_nothing():
    llm = HybridLLM(edge=WordDevice(), cloud=Cloud(fail=CloudUnavailableError("connection refused")),
                    policy=CloudRouter(), cache=False, max_cloud_tokens_per_day=10_000,
                    price_per_1k_tokens=PRICE)
    c = llm.chat(SHORT)
    assert c.route == "edge (cloud unavailable)" and c.cost_usd == 0
    assert budget(llm) == {**budget(llm), "calls_day": 0, "tokens_day": 0, "calls_in_flight": 0}
    assert llm.stats()["cloud_tokens"] == 0
    llm.close()


# --- a prompt too long for the device whose cloud cannot take it now -----------------------------


def test_a_spent_budget_is_a_retry_later_not_a_prompt_to_shorten():
    llm, edge = long_prompt_client(Cloud(), max_cloud_calls_per_hour=0)
    with pytest.raises(CloudBudgetSpentError) as info:
        llm.chat(LONG)
    err = info.value
    assert isinstance(err, CloudRateLimitError) and not isinstance(err, ContextWindowExceededError)
    assert err.reason.startswith("budget spent: 0/0 cloud calls this hour")
    assert (err.prompt_tokens, err.context_length) == (44, 32)
    assert "44 tokens" in str(err) and "Retry once the budget has room" in str(err)
    assert edge.generated == 0
    llm.close()


def test_a_prompt_the_clouds_own_window_refuses_too_is_still_too_long():
    refused = CloudUnavailableError("the cloud's context window cannot take this prompt (HTTP 400 "
                                    "context_length_exceeded: max 40 tokens)", status_code=400)
    llm, _ = long_prompt_client(Cloud(fail=refused))
    with pytest.raises(ContextWindowExceededError, match="it refuses it too") as info:
        llm.chat(LONG)
    assert (info.value.prompt_tokens, info.value.context_length) == (44, 32)
    llm.close()


def _post(llm, **body):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    req = {"model": "x", "messages": [{"role": "user", "content": LONG}], **body}
    with TestClient(create_app(llm)) as http:
        return [http.post("/v1/chat/completions", json={**req, "stream": s}) for s in (False, True)]


def test_the_proxy_answers_a_spent_budget_with_429_cloud_budget_spent():
    llm, _ = long_prompt_client(Cloud(), max_cloud_calls_per_hour=0)
    for r in _post(llm):
        error = r.json()["error"]
        assert r.status_code == 429 and error["code"] == "cloud_budget_spent", r.text
        assert int(r.headers["retry-after"]) >= 1
        assert "44 tokens" in error["message"] and "budget spent: 0/0" in error["message"]
    llm.close()


def test_the_proxy_answers_a_cloud_that_is_down_with_503_and_the_numbers():
    llm, _ = long_prompt_client(Cloud(up=False))
    for r in _post(llm):
        error = r.json()["error"]
        assert r.status_code == 503 and error["type"] == "upstream_unavailable", r.text
        assert "44 tokens" in error["message"] and "(32, n_ctx)" in error["message"]
        assert error.get("code") != "context_length_exceeded"
    llm.close()


def test_the_proxy_keeps_context_length_exceeded_for_a_prompt_no_window_holds():
    refused = CloudUnavailableError("context window", status_code=400)
    llm, _ = long_prompt_client(Cloud(fail=refused))
    for r in _post(llm):
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    llm.close()
