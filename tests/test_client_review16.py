"""The public client (helper-f4, review 16): ``cache=None`` per call is the client's default, as
None is for every other per-call option; a sync ``close()`` stops the answers streaming through
its ``AsyncHybridLLM.wrap()`` views (they run on the caller's loop, not on the client's own)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hybridllm import AsyncHybridLLM, ConfigError, Decision, HybridLLM, HybridLLMError
from hybridllm.backends.base import Backend, Delta
from hybridllm.backends.fake import FakeBackend


class _CountingCache:
    """A cache= with get() and put() only: counts lookups and stores, never hits."""

    def __init__(self) -> None:
        self.gets = 0
        self.puts = 0

    def get(self, *args, **kwargs):
        self.gets += 1
        return None

    def put(self, *args, **kwargs):
        self.puts += 1


@pytest.mark.parametrize("cache", [None, True])
def test_cache_none_per_call_is_the_clients_default(cache):
    """Before: chat("hi", cache=None) raised InvalidRequestError ("cache and cascade must be True
    or False.") while route=None, cascade=None or max_tokens=None meant the default."""
    store = _CountingCache()
    with HybridLLM(edge=FakeBackend(), cache=store) as llm:
        assert llm.chat("hi", cache=cache).text == "echo: hi"
        with llm.stream("hi again", cache=cache) as s:
            assert "".join(c.text for c in s) == "echo: hi again"

        async def main() -> str:
            return (await AsyncHybridLLM.wrap(llm).chat("hi there", cache=cache)).text

        assert asyncio.run(main()) == "echo: hi there"
    assert store.gets == 3 and store.puts == 3  # looked up and stored, as without the option


def test_cache_must_still_be_a_bool_or_none():
    with HybridLLM(edge=FakeBackend(), cache=False) as llm:
        with pytest.raises(HybridLLMError, match="cache and cascade must be True or False"):
            llm.chat("hi", cache="no")


class _SlowCloud(Backend):
    """A cloud that streams up to 200 words, 20 a second (10 s in all)."""

    name = "slow-cloud"
    model = "cloud-model"

    def __init__(self) -> None:
        self.sent = 0

    def stream(self, messages, params):  # pragma: no cover - the pipeline uses astream
        raise NotImplementedError

    async def astream(self, messages, params):
        for i in range(min(200, params.max_tokens)):
            await asyncio.sleep(0.05)
            self.sent += 1
            yield Delta(f"w{i} ")
        yield Delta("", "stop")


class _ToCloud:
    def decide(self, msgs, *, force=None, prompt_tokens=None, embedding=None):
        return Decision("cloud", "score 0.900 >= threshold 0.500", 0.9, msgs)

    def should_escalate(self, lp):
        return False


def _client(route: str) -> tuple[HybridLLM, Backend]:
    if route == "cloud":
        cloud = _SlowCloud()
        return HybridLLM(edge=FakeBackend(), cloud=cloud, policy=_ToCloud(), cache=False,
                         max_tokens=1000), cloud
    edge = FakeBackend(reply=lambda m: " ".join(["w"] * 200), delay_s=0.05)
    return HybridLLM(edge=edge, cache=False), edge


@pytest.mark.parametrize("route", ["cloud", "edge"])
def test_close_from_another_thread_stops_a_wrap_views_answer(route):
    """Before: the view's answer (on the caller's loop) streamed on to its end, 10 s after
    close(), and was reported as finished; now the reader gets HybridLLMError at once."""
    llm, _ = _client(route)
    got: list[str] = []
    closer = threading.Thread(target=llm.close)

    async def main() -> None:
        view = AsyncHybridLLM.wrap(llm)
        async with view.stream("hi") as s:
            async for chunk in s:
                got.append(chunk.text)
                if len(got) == 3:
                    closer.start()
        raise AssertionError(f"read to its end after close(): {len(got)} chunks")

    start = time.perf_counter()
    with pytest.raises(HybridLLMError, match="closed before this answer was complete"):
        asyncio.run(main())
    assert time.perf_counter() - start < 5 and len(got) < 50
    # the view's answer ends first, the client's close() goes on: on a loaded machine the wrap()
    # below could come before close() returned (and was taken: a flaky 'DID NOT RAISE')
    closer.join(10)
    with pytest.raises(HybridLLMError, match="closed"):  # and the view takes no new answer
        AsyncHybridLLM.wrap(llm).stream("again")


def test_close_on_the_views_own_loop_stops_its_cloud_answer():
    """close() called (sync) inside the coroutine that reads the view's stream."""
    llm, cloud = _client("cloud")

    async def main() -> None:
        async with AsyncHybridLLM.wrap(llm).stream("hi") as s:
            async for chunk in s:
                if chunk.text == "w2 ":
                    llm.close()

    with pytest.raises(HybridLLMError, match="closed before this answer was complete"):
        asyncio.run(main())
    assert cloud.sent < 50


def test_close_before_a_views_stream_is_read():
    llm, _ = _client("edge")
    stream = AsyncHybridLLM.wrap(llm).stream("hi")
    llm.close()

    async def main() -> None:
        async for _ in stream:
            pass

    with pytest.raises(HybridLLMError, match="closed"):
        asyncio.run(main())


def test_a_view_read_to_its_end_then_close_is_quiet():
    llm, _ = _client("cloud")

    async def main() -> str:
        return (await AsyncHybridLLM.wrap(llm).chat("hi", max_tokens=3)).text

    start = time.perf_counter()
    assert asyncio.run(main()).split() == ["w0", "w1", "w2"]
    llm.close()
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("what", ["llm", 42])
def test_wrap_refuses_what_is_not_a_sync_client(what):
    """Before: wrap("llm") raised AttributeError ('str' object has no attribute 'config')."""
    with pytest.raises(ConfigError, match=r"AsyncHybridLLM.wrap\(\) takes a HybridLLM; got "):
        AsyncHybridLLM.wrap(what)


def test_wrap_of_an_async_client_says_to_use_it_as_it_is():
    allm = AsyncHybridLLM(edge=FakeBackend(), cache=False)
    with pytest.raises(ConfigError, match="got AsyncHybridLLM: use it as it is"):
        AsyncHybridLLM.wrap(allm)
    asyncio.run(allm.aclose())


def test_close_stops_every_answer_of_every_view():
    llm, cloud = _client("cloud")

    async def read(view: AsyncHybridLLM, prompt: str) -> str:
        async with view.stream(prompt) as s:
            async for _ in s:
                pass
        return "finished"

    async def main() -> list:
        views = [AsyncHybridLLM.wrap(llm), AsyncHybridLLM.wrap(llm)]
        tasks = [asyncio.ensure_future(read(views[i % 2], f"q{i}")) for i in range(4)]
        await asyncio.sleep(0.3)
        await asyncio.to_thread(llm.close)
        return await asyncio.gather(*tasks, return_exceptions=True)

    start = time.perf_counter()
    out = asyncio.run(main())
    assert time.perf_counter() - start < 5
    assert all(isinstance(e, HybridLLMError) and "closed before this answer" in str(e) for e in out), out
