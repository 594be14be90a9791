"""``max_tokens`` bounds the whole answer when the device finishes a cloud answer that broke.

Before: the device continued the cloud's streamed text with the request's whole ``max_tokens``,
so the stitched answer (route ``cloud->edge``) ran past it: ``max_tokens=200`` gave 209
completion tokens through ``hybridllm serve`` against a cloud killed mid-stream, and ``max_tokens=8``
on SmolLM2 gave 16. Now the device writes what the cloud's part left (that part counted as the
answer's usage counts it), and a cloud part that used it all ends the answer there, cut at
``max_tokens`` (finish_reason "length", the device not asked).
"""

from __future__ import annotations

import asyncio

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM
from hybridllm._exceptions import CloudUnavailableError
from hybridllm.backends.fake import FakeBackend


class _Breaking(FakeBackend):
    """Streams two words ("aaaa", " bbbb": 1 + 2 tokens at ~4 characters a token), then the
    connection drops."""

    def __init__(self) -> None:
        super().__init__(model="cloud-model", reply=lambda m: "aaaa bbbb cccc dddd eeee")

    def stream(self, messages, params):
        for i, delta in enumerate(super().stream(messages, params)):
            if i == 2:
                raise CloudUnavailableError("connection reset mid-stream")
            yield delta


class _Edge(FakeBackend):
    def __init__(self) -> None:
        super().__init__(model="edge-model", reply=lambda m: " ".join(["w"] * 50))
        self.budgets: list[int] = []

    def stream_continuation(self, messages, prefix, params):
        self.budgets.append(params.max_tokens)
        return super().stream_continuation(messages, prefix, params)


def _llm(sync: bool = True):
    edge, cloud = _Edge(), _Breaking()
    cls = HybridLLM if sync else AsyncHybridLLM
    return cls(edge=edge, cloud=cloud, cache=False), edge


@pytest.mark.parametrize("streamed", [False, True])
def test_the_device_writes_what_the_cloud_part_left(streamed):
    llm, edge = _llm()
    try:
        if streamed:
            with llm.stream("q", route="cloud", max_tokens=10) as s:
                text = "".join(c.text for c in s)
            c = s.completion
            assert text == c.text
        else:
            c = llm.chat("q", route="cloud", max_tokens=10)
    finally:
        llm.close()
    assert c.route == "cloud->edge" and c.finish_reason == "length", (c.route, c.reason)
    assert edge.budgets == [7]  # 10 less the cloud's 3
    assert c.usage.completion_tokens == 10  # the cloud's 3 and the device's 7, not 13
    assert c.text.startswith("aaaa bbbb w")


def test_async_too():
    async def main():
        llm, edge = _llm(sync=False)
        async with llm:
            return await llm.chat("q", route="cloud", max_tokens=4), edge

    c, edge = asyncio.run(main())
    assert edge.budgets == [1] and c.usage.completion_tokens == 4 and c.finish_reason == "length"


def test_a_cloud_part_that_used_it_all_ends_the_answer_there():
    llm, edge = _llm()
    try:
        c = llm.chat("q", route="cloud", max_tokens=3)  # the cloud streams 3 tokens, then breaks
    finally:
        llm.close()
    assert edge.budgets == [] and edge.calls == []  # the device is not asked for more
    assert c.text == "aaaa bbbb" and c.finish_reason == "length"
    assert c.route == "cloud" and c.model == "cloud-model"
    assert "max_tokens (3) used" in c.reason
    assert c.usage.completion_tokens == 3


@pytest.mark.real
def test_smollm2_finishing_a_broken_answer_stays_within_max_tokens(smollm2_path):
    from hybridllm.backends.base import create_backend

    edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=2048, n_threads=1)
    cloud = _Breaking()
    cloud.reply = lambda m: "Once upon a time there was a very long story about many things"
    llm = HybridLLM(edge=edge, cloud=cloud, cache=False)
    try:
        c = llm.chat("Tell me a long story about a cat.", route="cloud", max_tokens=12, temperature=0)
    finally:
        llm.close()
    assert c.route == "cloud->edge" and c.text.startswith("Once upon")
    assert c.finish_reason == "length"
    # the cloud's 3 and the device's own count of what it wrote: 9 (before: 3 and 12)
    assert c.usage.completion_tokens == 12
