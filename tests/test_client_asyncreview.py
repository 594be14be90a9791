"""The async client in an app's event loop: aclose() with answers in flight, the wrap() view's
aclose(), and a loop that keeps running while the device stops. Fake backends and a real local
HTTP cloud (fast); the real llama.cpp model at the end."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM, HybridLLMError
from hybridllm._pipeline import Core
from hybridllm._stream import CLOSED_MID_ANSWER
from hybridllm.backends.base import Delta
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend
from tests.backends.test_cloud_http import _Handler

LONG = " ".join(["w"] * 300)


@pytest.fixture(scope="module")
def slow_cloud_url():
    """A real HTTP peer that streams a long answer, a token every 50 ms."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.hits = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/slow"
    httpd.shutdown()
    httpd.server_close()


async def _outcome(aw) -> str:
    try:
        await aw
    except BaseException as exc:  # noqa: BLE001 - the test compares what each reader got
        return f"{type(exc).__name__}: {exc}"
    return "answered"


def test_aclose_with_answers_in_flight_ends_each_with_the_sync_clients_error(slow_cloud_url, caplog):
    """Before: the device reader got EdgeError, the queued one "The device model is closed.", and
    the cloud reader a warning that the cloud stream broke, then "The device model is closed." from
    a device fallback; the sync client's close() says CLOSED_MID_ANSWER to all."""
    edge = FakeBackend(reply=lambda m: LONG, delay_s=0.01)
    cloud = CloudBackend(base_url=slow_cloud_url, model="m")
    want = f"HybridLLMError: {CLOSED_MID_ANSWER}"

    async def main() -> tuple[list[str], dict]:
        llm = AsyncHybridLLM(edge=edge, cloud=cloud, cache=False, max_cloud_calls_per_hour=100)
        tasks = [asyncio.ensure_future(_outcome(llm.chat("x", route=r))) for r in ("edge", "cloud", "edge")]
        await asyncio.sleep(0.3)  # the device and the cloud are both streaming
        await llm.aclose()
        outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        return outcomes, llm.stats()

    with caplog.at_level(logging.INFO, logger="hybridllm"):
        outcomes, stats = asyncio.run(main())
    assert outcomes == [want] * 3
    assert "broke" not in caplog.text  # a close is no cloud failure, and no device stands in
    assert stats["cloud_tokens"] > 0 and stats["budget"]["calls_in_flight"] == 0  # the cut call is paid

    # the sync client, closed from another thread, says the same
    with HybridLLM(edge=FakeBackend(reply=lambda m: LONG, delay_s=0.01), cache=False) as sync:
        got: list[str] = []

        def read() -> None:
            try:
                sync.chat("x")
            except HybridLLMError as exc:
                got.append(f"{type(exc).__name__}: {exc}")

        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.3)
        sync.close()
        reader.join(10)
    assert got == [want]


def test_a_stream_read_after_aclose_and_a_call_after_it_say_the_client_is_closed():
    async def main() -> list[str]:
        llm = AsyncHybridLLM(edge=FakeBackend(reply=lambda m: "a b c"), cache=False)
        unread = llm.stream("x")
        await llm.aclose()
        await llm.aclose()  # twice is fine

        async def read() -> None:
            async for _ in unread:
                pass

        return [await _outcome(read()), await _outcome(llm.chat("x"))]

    assert asyncio.run(main()) == ["HybridLLMError: This client is closed; create a new AsyncHybridLLM."] * 2


def test_a_wrap_views_aclose_leaves_the_sync_client_open():
    """Before: `async with AsyncHybridLLM.wrap(llm)` closed llm (its device model, cache and cloud),
    though wrap() promises to never close it; llm.chat then raised "This client is closed"."""
    with HybridLLM(edge=FakeBackend(reply=lambda m: "a b c"), cache=False) as llm:

        async def main() -> str:
            async with AsyncHybridLLM.wrap(llm) as view:
                return (await view.chat("x")).text

        assert asyncio.run(main()) == "a b c"
        assert llm.chat("x").text == "a b c"


class _SlowStep(FakeBackend):
    """A device whose step takes ``step_s`` (a long prompt's prefill on a slow CPU)."""

    def __init__(self, step_s: float) -> None:
        super().__init__(reply=lambda m: "a b c d e f")
        self.step_s = step_s

    def stream(self, messages, params):
        for word in "a b c d e f".split():
            time.sleep(self.step_s)
            yield Delta(word + " ")
        yield Delta("", finish_reason="stop")


def test_aclose_keeps_the_event_loop_running_while_the_device_stops():
    """Before: Core.aclose() waited for the device's step on the loop itself: an app's loop (a
    TUI redrawing, a server answering health checks) froze for that step, up to close_timeout_s."""
    core = Core(edge=_SlowStep(0.6))

    async def main() -> float:
        deltas = core.edge_worker.stream(lambda: core.edge.stream([], None))  # a job on the device
        await anext(deltas)  # the device is in its next 0.6 s step now
        gaps: list[float] = []

        async def tick() -> None:
            while True:
                t0 = time.perf_counter()
                await asyncio.sleep(0.01)
                gaps.append(time.perf_counter() - t0)

        ticker = asyncio.ensure_future(tick())
        await asyncio.sleep(0.02)
        await core.aclose()
        await asyncio.sleep(0.05)  # the tick that was due while aclose() ran is measured
        ticker.cancel()
        await deltas.aclose()  # type: ignore[attr-defined]
        return max(gaps)

    assert asyncio.run(main()) < 0.3


# -- the real llama.cpp model ----------------------------------------------------------------------
def test_real_model_cancel_then_aclose_in_flight(smollm2_path):
    """SmolLM2 on llama.cpp: a chat cancelled by wait_for and a stream cancelled mid-answer leave
    the device free for the next call (no EdgeBusyError, no wait), and aclose() with an answer in
    flight ends it with HybridLLMError while the loop keeps running."""
    from hybridllm.backends.base import create_backend

    async def main() -> tuple[str, str, str, float]:
        edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=2048, n_threads=1)
        llm = AsyncHybridLLM(edge=edge, cache=False)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(llm.chat("Write a long story about a cat.", max_tokens=200), 0.3)
        first = (await asyncio.wait_for(llm.chat("Say hi", max_tokens=5, temperature=0), 20)).text

        async def read() -> None:
            async for _ in llm.stream("Write a long story about a dog.", max_tokens=200):
                pass

        reader = asyncio.ensure_future(read())
        await asyncio.sleep(0.3)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        second = (await asyncio.wait_for(llm.chat("Say hi", max_tokens=5, temperature=0), 20)).text

        task = asyncio.ensure_future(_outcome(llm.chat("Write a long story about a bird. " * 30,
                                                        max_tokens=200)))
        await asyncio.sleep(0.2)
        gaps: list[float] = []

        async def tick() -> None:
            while True:
                t0 = time.perf_counter()
                await asyncio.sleep(0.01)
                gaps.append(time.perf_counter() - t0)

        ticker = asyncio.ensure_future(tick())
        await asyncio.sleep(0.02)
        await llm.aclose()
        await asyncio.sleep(0.05)  # the tick that was due while aclose() ran is measured
        ticker.cancel()
        return first, second, await task, max(gaps)

    first, second, outcome, gap = asyncio.run(main())
    assert first and first == second
    assert outcome == f"HybridLLMError: {CLOSED_MID_ANSWER}"
    assert gap < 0.5
