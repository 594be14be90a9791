"""Review 16 of the request pipeline: cache=None / cascade=None are the defaults (and nothing but a
bool or None passes), and the budget's room held for a cloud call that will not be made is freed
as soon as the device answers in the cloud's place, not when that answer ends."""

from __future__ import annotations

import asyncio
import threading

import pytest

from hybridllm import AsyncHybridLLM, CloudUnavailableError, HybridLLM, InvalidRequestError
from hybridllm._pipeline.request import Options
from hybridllm.backends.fake import FakeBackend
from tests.router.test_budget_concurrency import CloudRouter


def test_cache_none_and_cascade_none_are_the_defaults():
    # Before: Options.pop_from({"cache": None}) raised "cache and cascade must be True or False."
    # (the client drops cache=None first; the pipeline's own rule said otherwise)
    opts = Options.pop_from({"cache": None, "cascade": None})
    assert (opts.cache, opts.cascade) == (True, None)
    assert Options.pop_from({"cache": False, "cascade": True}).cache is False


@pytest.mark.parametrize("name, value", [("cascade", 1), ("cascade", 0), ("cascade", "yes"), ("cache", 1),
                                         ("cache", "no")])
def test_cache_and_cascade_take_a_bool_or_none_and_the_error_names_which(name, value):
    # Before: cascade=1 and cascade=0 passed ("in (None, True, False)" compares with ==) while
    # cache=1 was refused; the message named neither the option nor its value, nor None
    with pytest.raises(InvalidRequestError, match=f"or None for the default; got {name}={value!r}"):
        Options.pop_from({name: value})
    with HybridLLM(edge=FakeBackend(), cache=False) as llm:
        with pytest.raises(InvalidRequestError, match=f"got {name}="):
            llm.chat("hi", **{name: value})


class _Cloud(FakeBackend):
    """A cloud down (its circuit open), or up and failing before its first token."""

    def __init__(self, up: bool) -> None:
        super().__init__(model="cloud-model")
        self.up, self.calls_made = up, 0

    def is_available(self):
        return self.up

    async def astream(self, messages, params, **kw):
        self.calls_made += 1
        raise CloudUnavailableError("HTTP 503")
        yield  # pragma: no cover - an async generator


class _HeldEdge(FakeBackend):
    """A device whose answer waits until ``go`` is set (started: ``answering``); 50 tokens of context."""

    def __init__(self) -> None:
        super().__init__(model="edge-model", reply=lambda m: "device answer", context_length=50)
        self.answering, self.go = threading.Event(), threading.Event()

    def stream(self, messages, params):
        self.answering.set()
        assert self.go.wait(10)
        yield from super().stream(messages, params)


@pytest.mark.parametrize("up", [False, True])
def test_the_device_answering_for_the_cloud_holds_no_budget(up):
    # max_cloud_calls_per_hour=1; request A is routed to the cloud, which is down (or fails before
    # its first token), so the device answers it. While it does, request B comes. Before, A's
    # reservation was held until its device answer ended: B read "budget spent: 1/1 cloud calls this
    # hour (1 in flight)", and a B too long for the device failed with CloudBudgetSpentError, with no
    # call made and nothing spent; now B learns what is true of the cloud
    edge, cloud = _HeldEdge(), _Cloud(up)
    llm = HybridLLM(edge=edge, cloud=cloud, policy=CloudRouter(), cache=False, max_cloud_calls_per_hour=1)
    allm = AsyncHybridLLM.wrap(llm)

    async def main():
        a = asyncio.create_task(allm.chat("hard question"))
        assert await asyncio.to_thread(edge.answering.wait, 10)
        assert llm.stats()["budget"]["calls_in_flight"] == 0
        with pytest.raises(CloudUnavailableError) as err:  # past the device's 50 tokens
            await allm.chat("hard question " + "word " * 200)
        assert "budget" not in str(err.value), err.value
        edge.go.set()
        return await a

    try:
        first = asyncio.run(main())
    finally:
        edge.go.set()
    assert first.route == "edge (cloud unavailable)" and first.text == "device answer"
    assert "budget" not in first.reason, first.reason
    assert cloud.calls_made == (2 if up else 0)
    st = llm.stats()
    assert st["budget"] == {"calls_hour": 0, "calls_day": 0, "tokens_hour": 0, "tokens_day": 0,
                            "calls_in_flight": 0}
    assert (st["cloud_tokens"], st["cloud_cost_usd"]) == (0, 0.0)
    llm.close()
