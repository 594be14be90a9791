"""The cloud client's field retry, the cloud-call accounting and the budget together, with the real
SmolLM2 on the device (llama.cpp) and a real HTTP cloud on loopback that refuses top_k as a hosted
API does and then breaks off mid-answer: the sync client's inline device path and the async path
give the same answer and usage, the stats stay the ledger's, and `hybridllm chat` answers a
conversation too long for the device on the device when the budget is spent. The fast versions on
fakes are in tests/test_combinations_cloud2.py."""

from __future__ import annotations

import asyncio

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM

from ..test_combinations import CloudRouter
from ..test_combinations_cloud2 import PRICE, HostedCloud

pytestmark = pytest.mark.real

PROMPT = "Name three colours."


@pytest.fixture
def hosted():
    servers: list[HostedCloud] = []

    def make(pieces: list[str], mode: str = "break", usage: tuple[int, int] | None = None) -> HostedCloud:
        servers.append(HostedCloud(pieces, mode, usage))
        return servers[-1]

    yield make
    for srv in servers:
        srv.stop()


def _device(smollm2_path, n_ctx: int = 512):
    from hybridllm.backends.base import create_backend

    return create_backend("llama_cpp", model=str(smollm2_path), n_ctx=n_ctx, n_threads=1)


def test_real_device_continues_a_hosted_answer_alike_on_the_sync_and_async_paths(smollm2_path, hosted):
    cloud: HostedCloud = hosted(["Red, ", "green"])  # then the connection drops
    with HybridLLM(edge=_device(smollm2_path), cloud_url=cloud.url, policy=CloudRouter(), cache=False,
                   max_tokens=10, temperature=0.0, cloud_max_retries=0, price_per_1k_tokens=PRICE,
                   max_cloud_tokens_per_day=100_000) as llm:
        n = llm.edge.count_tokens([{"role": "user", "content": PROMPT}])
        stream = llm.stream(PROMPT)  # the device's part on this thread (the inline path)
        sync_texts = [ch.text for ch in stream]
        sync = stream.completion

        async def run():
            async with AsyncHybridLLM.wrap(llm).stream(PROMPT) as s:
                texts = [ch.text async for ch in s]
            return texts, s.completion

        async_texts, asynch = asyncio.run(run())
        s = llm.stats()
    assert sync is not None and asynch is not None
    assert sync.route == asynch.route == "cloud->edge"
    assert sync.text == asynch.text == "".join(sync_texts) == "".join(async_texts)
    assert sync.text.startswith("Red, green") and len(sync.text) > len("Red, green")  # the device wrote on
    assert sync.usage.to_dict() == asynch.usage.to_dict()
    # top_k refused once, remembered: three POSTs, two calls in the budget
    assert [("top_k" in b) for b in cloud.bodies] == [True, False, False]
    streamed = 2 + 2  # "Red, " and "green": 5 characters each, ceil(5 / 4) tokens
    assert s["budget"]["calls_day"] == 2 and s["budget"]["calls_in_flight"] == 0
    assert s["cloud_tokens"] == s["budget"]["tokens_day"] == 2 * (n + streamed)
    assert s["cloud_cost_usd"] == pytest.approx(sync.cost_usd + asynch.cost_usd, abs=1e-9)
    # the answer's usage is the whole answer: the prompt once, the cloud's part and the device's
    device = sync.usage.completion_tokens - streamed
    assert sync.usage.prompt_tokens == n and device > 0
    # the device's part of both answers is what a cloud-only client would also have paid for
    assert s["cost_saved_vs_cloud_only_usd"] == pytest.approx(2 * device / 1000 * PRICE, abs=1e-9)


def test_real_chat_answers_a_too_long_conversation_on_the_device_when_the_budget_is_spent(
        smollm2_path, hosted, monkeypatch, capsys):
    from hybridllm import _chat_cli, cli

    cloud: HostedCloud = hosted(["never"], mode="whole", usage=(5, 1))
    llm = HybridLLM(edge=_device(smollm2_path, n_ctx=256), cloud_url=cloud.url, policy=CloudRouter(),
                    cache=False, temperature=0.0, cloud_max_retries=0, max_cloud_calls_per_hour=0)
    monkeypatch.setattr(_chat_cli, "_client", lambda args: llm)
    # each turn about 150 tokens: the second makes the conversation too long for n_ctx 256
    turns = ["Say ok. " + "filler " * 140, "Say yes. " + "filler " * 140]

    class Piped:
        def isatty(self) -> bool:
            return False

    lines = list(turns)

    def fake_input(prompt: str = "") -> str:
        if not lines:
            raise EOFError
        return lines.pop(0)

    monkeypatch.setattr("builtins.input", fake_input)
    monkeypatch.setattr("sys.stdin", Piped())
    assert cli.main(["chat", "--max-tokens", "6"]) == 0
    out, err = capsys.readouterr()
    assert "dropped its 2 oldest messages and the device answers" in err, err
    assert "error:" not in err, err
    assert cloud.bodies == []  # the budget of 0 sent nothing to the cloud


def test_real_device_part_stopped_by_the_reader_leaves_the_stats_equal_to_the_ledger(smollm2_path, hosted):
    cloud: HostedCloud = hosted(["Red, ", "green"])  # then the connection drops
    with HybridLLM(edge=_device(smollm2_path), cloud_url=cloud.url, policy=CloudRouter(), cache=False,
                   max_tokens=24, temperature=0.0, cloud_max_retries=0, price_per_1k_tokens=PRICE,
                   max_cloud_tokens_per_day=100_000) as llm:
        n = llm.edge.count_tokens([{"role": "user", "content": PROMPT}])
        stream = llm.stream(PROMPT)
        for chunk in stream:
            if chunk.route == "cloud->edge":  # the device's first words: the reader has enough
                break
        stream.close()
        s = llm.stats()
    assert s["requests"] == 0 and s["budget"]["calls_day"] == 1 and s["budget"]["calls_in_flight"] == 0
    # no answer, but the cloud call cost its prompt and what it streamed ("Red, " and "green": 2 + 2),
    # in the stats as in the ledger
    assert s["cloud_tokens"] == s["budget"]["tokens_day"] == n + 4
    assert s["cloud_cost_usd"] == pytest.approx((n + 4) / 1000 * PRICE, abs=1e-9)
