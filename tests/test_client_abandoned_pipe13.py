"""A sync stream read with next() and dropped: the garbage collector may close it on the client's
own loop thread, which must not wait there for a step of that loop (it stalled every answer of
the client for 60 s)."""

from __future__ import annotations

import gc
import time

import pytest

from hybridllm.router.budget import Budget
from tests.test_pipeline import make


async def _collect_here() -> float:
    began = time.perf_counter()
    gc.collect()
    return time.perf_counter() - began


@pytest.mark.parametrize("question", ["easy question", "hard question"])  # the device, the cloud
def test_a_dropped_stream_collected_on_the_loop_thread_does_not_stall_the_client(question):
    llm, edge, cloud = make()
    llm._core.ledger = budget = Budget(max_cloud_calls_per_hour=100)
    cloud.reply = lambda m: "a b c d e f g h"
    edge.reply = lambda m: "a b c d e f g h"
    gc.disable()  # collected where the test says: on the loop thread
    try:
        s = llm.stream(question, cache=False)
        assert next(s).text
        del s  # a cycle (its reader holds it): only the collector frees it
        took = llm._loop.submit(_collect_here()).result(timeout=30)
    finally:
        gc.enable()
    assert took < 5
    # the answer was stopped all the same: the device takes the next request, the cloud call
    # is accounted and its reservation settled
    assert llm.chat("easy other question", cache=False).route == "edge"
    deadline = time.monotonic() + 5
    while budget.usage()["calls_in_flight"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert budget.usage()["calls_in_flight"] == 0
    if question.startswith("hard"):
        assert llm.stats()["cloud_tokens"] == budget.usage()["tokens_day"] > 0
    llm.close()
