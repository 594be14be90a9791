"""The sync and async clients as one API: the same signatures, the same errors for the same
misuse, copy/pickle refused clearly, and close()/aclose() from two callers at once (fast, fakes)."""

from __future__ import annotations

import asyncio
import copy
import inspect
import pickle
import threading
import time

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM, HybridLLMError, InvalidRequestError, StreamConsumedError
from hybridllm._client import AsyncStream, Stream
from hybridllm.backends.fake import FakeBackend

# the sync name -> its async twin (the rest have the same name on both)
TWINS = {"close": "aclose", "__enter__": "__aenter__", "__exit__": "__aexit__"}
STREAM_TWINS = {"close": "aclose", "__enter__": "__aenter__", "__exit__": "__aexit__",
                "__iter__": "__aiter__", "__next__": "__anext__"}


def _public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")} | {
        n for n in ("__enter__", "__exit__", "__iter__", "__next__") if hasattr(cls, n)}


def _params(fn) -> list[tuple[str, object, object]]:
    sig = inspect.signature(fn)
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


@pytest.mark.parametrize("sync_cls, async_cls, twins, async_only", [
    (HybridLLM, AsyncHybridLLM, TWINS, {"wrap"}),
    (Stream, AsyncStream, STREAM_TWINS, set()),
])
def test_every_sync_method_has_an_async_twin_with_the_same_parameters(sync_cls, async_cls, twins,
                                                                      async_only):
    """A drift (a new option on one client only, a keyword-only marker lost) fails here."""
    mine = _public(sync_cls)
    assert {n for n in dir(async_cls) if not n.startswith("_")} == {
        twins.get(n, n) for n in mine if not n.startswith("_")} | async_only
    for name in mine:
        ours, twin = getattr(sync_cls, name), getattr(async_cls, twins.get(name, name))
        if isinstance(ours, property) or not callable(ours):
            assert isinstance(twin, property) == isinstance(ours, property), name
            continue
        assert _params(ours) == _params(twin), name
        if name in ("chat", "close", "__enter__", "__exit__", "__next__"):
            assert inspect.iscoroutinefunction(twin), name
    assert _params(HybridLLM.__init__) == _params(AsyncHybridLLM.__init__)


def _edge() -> FakeBackend:
    return FakeBackend(reply=lambda m: "one two three four five")


def _ops():
    return [copy.copy, copy.deepcopy, pickle.dumps]


@pytest.mark.parametrize("op", _ops(), ids=["copy", "deepcopy", "pickle"])
def test_a_sync_client_is_not_copied_but_refused_clearly(op):
    """Before: copy.copy() made a copy sharing the loop thread and the model, and closing the copy
    closed the original ("This client is closed"); deepcopy and pickle said "cannot pickle
    '_thread.lock' object"."""
    with HybridLLM(edge=_edge(), cache=False) as llm:
        with pytest.raises(TypeError, match="HybridLLM cannot be copied or pickled"):
            other = op(llm)
            if isinstance(other, HybridLLM):
                other.close()  # (what a copy's owner does: it closed the original's loop)
        assert llm.chat("hi").text == "one two three four five"  # the original is whole


@pytest.mark.parametrize("op", _ops(), ids=["copy", "deepcopy", "pickle"])
def test_an_async_client_is_not_copied_but_refused_clearly(op):
    async def main() -> None:
        async with AsyncHybridLLM(edge=_edge(), cache=False) as llm:
            with pytest.raises(TypeError, match="AsyncHybridLLM cannot be copied or pickled"):
                op(llm)
            assert (await llm.chat("hi")).text == "one two three four five"

    asyncio.run(main())


@pytest.mark.parametrize("op", _ops(), ids=["copy", "deepcopy", "pickle"])
def test_a_stream_is_not_copied_but_refused_clearly(op):
    """A copy of a stream shared its one answer with the original, each marked unread."""
    with HybridLLM(edge=_edge(), cache=False) as llm:
        with llm.stream("hi") as s:
            with pytest.raises(TypeError, match="Stream cannot be copied or pickled"):
                op(s)
            assert "".join(c.text for c in s) == "one two three four five"

        async def main() -> None:
            view = AsyncHybridLLM.wrap(llm)
            async with view.stream("hi") as s:
                with pytest.raises(TypeError, match="AsyncStream cannot be copied or pickled"):
                    op(s)
                assert "".join([c.text async for c in s]) == "one two three four five"

        asyncio.run(main())


class _SlowLookupCache:
    """A cache whose lookup runs until the test lets it go."""

    def __init__(self) -> None:
        self.in_get, self.release = threading.Event(), threading.Event()
        self.getting = False
        self.closed_while_getting: bool | None = None

    def get(self, *args, **kwargs):
        self.getting = True
        self.in_get.set()
        self.release.wait(10)
        self.getting = False

    def put(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        self.closed_while_getting = self.getting


def test_a_second_close_from_another_thread_waits_for_the_first():
    """Before: while the first close() waited for a running cache lookup to end, a second one
    (another thread, an atexit handler) returned at once, before the client was closed, and
    closed the cache under that lookup."""
    cache = _SlowLookupCache()
    llm = HybridLLM(edge=_edge(), cache=cache)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            llm.chat("hi")
        except HybridLLMError as exc:
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    assert cache.in_get.wait(5)
    first = threading.Thread(target=llm.close)
    first.start()
    time.sleep(0.2)  # the first close() waits for the lookup
    threading.Timer(0.3, cache.release.set).start()
    llm.close()
    assert cache.release.is_set()  # it returned only once the lookup had ended
    assert cache.closed_while_getting is False
    first.join(10)
    reader.join(10)
    assert not first.is_alive() and not reader.is_alive()
    assert len(errors) == 1 and "closed" in str(errors[0])


class _SlowCloseEdge(FakeBackend):
    closed_at: float | None = None

    def close(self) -> None:
        time.sleep(0.3)  # freeing the model takes a while
        self.closed_at = time.monotonic()


def test_a_second_aclose_from_another_task_waits_for_the_first():
    """The async twin: a second aclose() returned at once, the device model still loaded."""
    edge = _SlowCloseEdge()

    async def main() -> None:
        llm = AsyncHybridLLM(edge=edge, cache=False)
        await llm.chat("hi")
        first = asyncio.create_task(llm.aclose())
        await asyncio.sleep(0.05)
        await llm.aclose()
        assert edge.closed_at is not None
        await first
        await llm.aclose()  # then idempotent

    asyncio.run(main())


def test_the_same_misuse_raises_the_same_error_from_both_clients():
    async def on_async(how: str) -> None:
        async with AsyncHybridLLM(edge=_edge(), cache=False) as llm:
            if how == "stream":
                llm.stream("hi", colour="blue")
            else:
                await llm.chat("hi", max_tokens="many")

    sync = HybridLLM(edge=_edge(), cache=False)
    for how in ("stream", "chat"):
        with pytest.raises(InvalidRequestError):
            if how == "stream":
                sync.stream("hi", colour="blue")
            else:
                sync.chat("hi", max_tokens="many")
        with pytest.raises(InvalidRequestError):
            asyncio.run(on_async(how))
    sync.close()
    sync.close()
    with pytest.raises(HybridLLMError, match="closed"):
        sync.chat("hi")

    async def closed() -> None:
        llm = AsyncHybridLLM(edge=_edge(), cache=False)
        await llm.aclose()
        await llm.aclose()
        with pytest.raises(HybridLLMError, match="closed"):
            await llm.chat("hi")

    asyncio.run(closed())


def test_leaving_a_for_loop_begun_with_next_stops_the_answer():
    """``first = next(s)`` then ``for chunk in s: break`` (the openai idiom): before, the loop read
    the stream's own reader and leaving it stopped nothing: the device generated the rest of the
    answer for no one, and the next request waited for it (2 s here). The async stream stopped."""
    edge = FakeBackend(reply=lambda m: " ".join(["w"] * 200), delay_s=0.01)
    with HybridLLM(edge=edge, cache=False) as llm:
        s = llm.stream("go")
        assert next(s).text == "w"
        for _ in s:
            break
        began = time.monotonic()
        assert llm.chat("again", max_tokens=2).text == "w w"
        assert time.monotonic() - began < 1.0
        assert edge.tokens_generated < 50
        with pytest.raises(HybridLLMError):  # stopped half way: not passed off as an end
            next(s)
        # read to its end the same way, it ends as before
        s = llm.stream("go", max_tokens=3)
        assert next(s).text == "w"
        assert "".join(c.text for c in s) == " w w"
        assert s.completion is not None and s.completion.text == "w w w"
        with pytest.raises(StopIteration):
            next(s)


def test_a_close_in_the_reading_loop_is_not_blamed_on_another_thread():
    """The error named "close() from another thread" for a close() in the loop's own body, on
    both clients; it now names the close without guessing where it came from."""
    with HybridLLM(edge=_edge(), cache=False) as llm:
        with pytest.raises(StreamConsumedError, match="before its answer was complete") as sync_err:
            for _ in (s := llm.stream("hi")):
                s.close()

    async def main() -> StreamConsumedError:
        async with AsyncHybridLLM(edge=_edge(), cache=False) as llm:
            with pytest.raises(StreamConsumedError) as err:
                async for _ in (s := llm.stream("hi")):
                    await s.aclose()
            return err.value

    async_err = asyncio.run(main())
    assert str(sync_err.value) == str(async_err)
    assert "another thread" not in str(async_err)


def test_two_readers_of_one_stream_get_a_clear_error_and_the_answer_stays_whole():
    """next() from two threads raised "ValueError: generator already executing"; anext() from
    two tasks "RuntimeError: aclose(): asynchronous generator is already running", and closed
    the answer under the first reader."""
    words = " ".join(["w"] * 30)
    with HybridLLM(edge=FakeBackend(reply=lambda m: words, delay_s=0.02), cache=False) as llm:
        s = llm.stream("x")
        texts = [next(s).text]
        errors: list[BaseException] = []

        def read() -> None:
            try:
                while True:
                    texts.append(next(s).text)
            except StopIteration:
                pass
            except Exception as exc:  # noqa: BLE001 - what the test checks
                errors.append(exc)

        readers = [threading.Thread(target=read) for _ in range(2)]
        for t in readers:
            t.start()
        for t in readers:
            t.join(10)
        assert errors and all(isinstance(e, StreamConsumedError) and "another thread" in str(e)
                              for e in errors)
        # what was read, by either thread, is the whole answer, in order (or the refused thread
        # left and the other read on to the end)
        assert "".join(texts) == words and s.completion.text == words

    async def main() -> None:
        async with AsyncHybridLLM(edge=FakeBackend(reply=lambda m: words, delay_s=0.02),
                                  cache=False) as llm:
            s = llm.stream("x")
            first = await anext(s)
            got = await asyncio.gather(anext(s), anext(s), return_exceptions=True)
            assert isinstance(got[1], StreamConsumedError) and "another thread or task" in str(got[1])
            rest = [c.text async for c in s]
            assert first.text + got[0].text + "".join(rest) == words == s.completion.text

    asyncio.run(main())
