"""The sync client closed while one of its answers is paused between two chunks, and a half-read
stream collected by the garbage collector: both end quietly (fast, fakes)."""

from __future__ import annotations

import gc
import logging
import sys

import pytest

from hybridllm import HybridLLM, HybridLLMError, StreamConsumedError
from hybridllm._stream import CLOSED_MID_ANSWER
from hybridllm.backends.fake import FakeBackend


def _client(**kw) -> tuple[HybridLLM, FakeBackend]:
    # a custom cloud with only stream(): Backend.astream steps it on a pool thread, and its
    # cleanup awaits that thread (as httpx's does closing a response)
    cloud = FakeBackend(model="cloud-m", reply=lambda m: " ".join(["c"] * 40))
    edge = FakeBackend(model="edge-m", reply=lambda m: " ".join(["w"] * 40))
    return HybridLLM(edge=edge, cloud=cloud, cache=False, max_cloud_calls_per_hour=10, **kw), cloud


def _read_some(stream, how: str):
    if how == "next":
        for _ in range(3):
            next(stream)
        return None
    loop = iter(stream)
    for _ in range(3):
        next(loop)
    return loop


@pytest.mark.parametrize("route", ["cloud", "edge"])
@pytest.mark.parametrize("how", ["next", "for"])
def test_close_while_an_answer_is_paused_prints_nothing_and_tells_the_reader(caplog, route, how):
    """Before: the loop's shutdown closed every generator of the paused answer at once, each while
    the one above it was closing it: "an error occurred during closing of asynchronous generator
    ... aclose(): asynchronous generator is already running", one traceback per generator."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    llm, _ = _client()
    stream = llm.stream("hello there", route=route)
    loop = _read_some(stream, how)
    llm.close()
    with pytest.raises(HybridLLMError) as err:
        next(stream) if loop is None else next(loop)
    assert str(err.value) == CLOSED_MID_ANSWER
    assert not isinstance(err.value, StreamConsumedError)  # the client was closed, not the stream
    errors = [r.getMessage() for r in caplog.records if r.name == "asyncio" and r.levelno >= logging.ERROR]
    assert errors == []
    stats = llm.stats()
    assert stats["budget"]["calls_in_flight"] == 0
    if route == "cloud":  # the call that was stopped is counted, as the budget counts it
        assert stats["cloud_tokens"] == stats["budget"]["tokens_day"] > 0


def test_close_from_the_reading_loop_itself_is_quiet(caplog):
    caplog.set_level(logging.ERROR, logger="asyncio")
    llm, _ = _client()
    with pytest.raises(HybridLLMError, match="closed before this answer"):
        for _ in llm.stream("hello there", route="cloud"):
            llm.close()
    assert [r for r in caplog.records if r.name == "asyncio"] == []


def test_a_stream_never_read_says_the_client_is_closed():
    llm, _ = _client()
    stream = llm.stream("hello there", route="cloud")
    llm.close()
    with pytest.raises(HybridLLMError, match="client is closed; create a new HybridLLM"):
        next(stream)


@pytest.mark.parametrize("route", ["cloud", "edge"])
def test_a_half_read_stream_collected_in_a_cycle_is_closed_quietly(monkeypatch, route):
    """Before: __del__ closed the reader, whose cleanup reached the stream through a weak proxy the
    collector had already cleared: "Exception ignored in: Stream.__del__ ... ReferenceError"
    (also at exit, for a stream read with next() and left open), and the rest of its close (the
    pipeline's, that ends the cloud call) was skipped."""
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    llm, _ = _client()
    try:
        stream = llm.stream("hello there", route=route)
        next(stream)
        stream.me = stream  # a cycle: only the garbage collector frees it
        del stream
        gc.collect()
        assert [getattr(u, "exc_value", u) for u in unraisable] == []
        assert llm.stats()["budget"]["calls_in_flight"] == 0
        assert llm.chat("again", route=route, max_tokens=2).text  # the device or cloud is free
    finally:
        llm.close()
