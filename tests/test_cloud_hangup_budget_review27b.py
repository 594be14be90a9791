"""A caller that gives up while its cloud request waits to be sent costs no cloud call.

Before: a cloud call the caller stopped before its first token always counted as a call of its
prompt (the rule for a request that went out: the cloud read the prompt), also while the client
was waiting out the cloud's Retry-After or the backoff before its next attempt. Against a cloud
answering 429 with ``Retry-After: 5``, three callers that timed out after 0.5 s each counted a
cloud call, in the budget, ``stats()["cloud_tokens"]`` and ``cloud_cost_usd``, though the server
saw one request and answered none: with ``max_cloud_calls_per_hour=2`` the budget was spent and
every request for the next hour went to the device. Now such a call costs nothing; one stopped
while its request was out at the cloud still counts its prompt. Real HTTP, as in
test_cloud_slow_reader_review27b.
"""

from __future__ import annotations

import asyncio

import pytest

from hybridllm import AsyncHybridLLM

from .test_cloud_slow_reader_review27b import Server, respond
from .test_combinations import CloudRouter
from .test_context_window import WordDevice

PROMPT = "hello there"  # 6 tokens for WordDevice (2 words + 4 a message)


def _refusing(status: int):
    async def handler(reader, writer, server) -> None:
        respond(writer, status, b'{"error": {"message": "slow down"}}', {"retry-after": "5"})
    return handler


async def _silent(reader, writer, server) -> None:
    await server.quiet(10)  # the request is at the cloud, which has not answered yet


def _client(server: Server) -> AsyncHybridLLM:
    return AsyncHybridLLM(edge=WordDevice(), cloud_url=server.url, policy=CloudRouter(), cache=False,
                          max_cloud_calls_per_hour=2, price_per_1k_tokens=0.002, cloud_max_retries=2)


async def _give_up(llm: AsyncHybridLLM, after_s: float) -> str | None:
    """None when the caller gave up after ``after_s``; else the route of the answer it got."""
    try:
        return (await asyncio.wait_for(llm.chat(PROMPT), after_s)).route
    except TimeoutError:
        return None


@pytest.mark.parametrize("status", [429, 503])
def test_callers_that_time_out_during_a_retry_after_spend_no_budget(status):
    server = Server(_refusing(status))

    async def main():
        async with _client(server) as llm:
            # the first request's wait after its 429, then two waiting to be sent
            routes = [await _give_up(llm, 0.5) for _ in range(3)]
            return routes, llm.stats(), llm._core.ledger.exhausted()

    try:
        routes, stats, spent = asyncio.run(main())
    finally:
        server.stop()
    assert len(server.posts) == 1  # one request reached the cloud, and it was refused
    # before: calls_day 2, tokens_day 12, cloud_tokens 12, and "budget spent: 2/2 cloud calls"
    assert stats["budget"]["calls_day"] == 0 and stats["budget"]["tokens_day"] == 0
    assert stats["budget"]["calls_in_flight"] == 0
    assert stats["cloud_tokens"] == 0 and stats["cloud_cost_usd"] == 0
    assert spent is None
    assert routes == [None, None, None]  # before: the third was answered by the device, "budget spent"


def test_a_caller_that_gives_up_while_its_request_is_at_the_cloud_still_pays_its_prompt():
    server = Server(_silent)

    async def main():
        async with _client(server) as llm:
            assert await _give_up(llm, 0.5) is None
            return llm.stats()

    try:
        stats = asyncio.run(main())
    finally:
        server.stop()
    assert len(server.posts) == 1
    assert stats["budget"]["calls_day"] == 1 and stats["budget"]["tokens_day"] == 6
    assert stats["cloud_tokens"] == 6 and stats["budget"]["calls_in_flight"] == 0
