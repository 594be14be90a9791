"""The client's surface on the fake backend (fast): streams, threads, the async client.
The same on the real llama.cpp model is in backends/test_llama_cpp_real.py."""

import asyncio
import re
import threading
import time

import pytest

from hybridllm import (
    AsyncHybridLLM,
    ConfigError,
    EdgeBusyError,
    HybridLLM,
    HybridLLMError,
    InvalidRequestError,
    StreamConsumedError,
)
from hybridllm.backends.fake import FakeBackend


@pytest.fixture
def llm():
    client = HybridLLM(edge=FakeBackend(reply=lambda m: "one two three four five"), cache=False)
    yield client
    client.close()


def test_chat_returns_a_completion_with_trace(llm):
    c = llm.chat("hello", max_tokens=3)
    assert c.text == "one two three"
    assert (c.route, c.model, c.finish_reason) == ("edge", "fake-model", "length")
    assert c.usage.completion_tokens == 3
    assert c.ttft_ms is not None and c.latency_ms >= c.ttft_ms


def test_stream_text_equals_chat_text(llm):
    stream = llm.stream("hello")
    text = "".join(ch.text for ch in stream)
    assert text == llm.chat("hello").text == stream.completion.text
    assert stream.completion.finish_reason == "stop"


def test_breaking_out_of_a_stream_stops_the_backend():
    """A model that takes time per token (as a real one does): the reader takes 3 chunks and
    leaves; generation stops there and does not go on afterwards."""
    backend = FakeBackend(reply=lambda m: " ".join(["w"] * 100), delay_s=0.01)
    with HybridLLM(edge=backend, cache=False) as llm:
        for i, _ in enumerate(llm.stream("go")):
            if i == 2:
                break
        stopped_at = backend.tokens_generated
        time.sleep(0.3)  # 30 more tokens' time
        assert 3 <= stopped_at <= 8 and backend.tokens_generated == stopped_at


def test_bad_input_raises_at_the_call_not_mid_stream(llm):
    with pytest.raises(InvalidRequestError):
        llm.stream([])
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        llm.stream("hi", max_tokens=-5)
    with pytest.raises(InvalidRequestError, match="must be a string"):  # was a bare TypeError
        llm.chat([{"role": "user", "content": [{"type": "text", "text": {}}]}])


def test_route_cloud_without_a_cloud_raises_at_the_call(llm):
    with pytest.raises(ConfigError, match="cloud_url"):
        llm.stream("x", route="cloud")  # before: a Stream, and the error at the first next()


def test_a_bad_default_in_the_config_file_fails_when_the_client_is_built(tmp_path):
    """Before: HybridLLM(config=...) with temperature = 9 raised an InvalidRequestError (a request
    error) that did not name the file."""
    path = tmp_path / "config.toml"
    path.write_text("[hybridllm]\ntemperature = 9\n")
    with pytest.raises(ConfigError) as err:
        HybridLLM(config=str(path), edge=FakeBackend(reply=lambda m: "ok"), cache=False)
    assert str(err.value) == f"Config file {path}: temperature must be between 0 and 2, got 9."
    with pytest.raises(ConfigError, match="top_p must be in"):  # constructor arguments alike
        HybridLLM(top_p=0, edge=FakeBackend(reply=lambda m: "ok"), cache=False)


def test_a_bad_value_that_a_later_source_overrides_is_not_an_error(tmp_path, monkeypatch):
    """Arguments override the environment, which overrides the file: a bad value there that is
    overridden is never used, so it is no error (a bad one that is used still is)."""
    path = tmp_path / "config.toml"
    path.write_text("[hybridllm]\ntemperature = 9\ntop_p = 0\n")
    monkeypatch.setenv("HYBRIDLLM_TOP_P", "0.9")
    monkeypatch.setenv("HYBRIDLLM_MIN_P", "5")
    llm = HybridLLM(config=str(path), temperature=0.2, min_p=0.1, edge=FakeBackend(reply=lambda m: "ok"),
                    cache=False)
    assert (llm.config.temperature, llm.config.top_p, llm.config.min_p) == (0.2, 0.9, 0.1)
    llm.close()
    with pytest.raises(ConfigError, match="HYBRIDLLM_MIN_P"):
        HybridLLM(config=str(path), temperature=0.2, edge=FakeBackend(reply=lambda m: "ok"), cache=False)


def test_a_stream_is_read_once_and_is_a_context_manager(llm):
    with llm.stream("hello") as stream:
        assert "".join(ch.text for ch in stream) == "one two three four five"
    with pytest.raises(StreamConsumedError, match="already read"):
        iter(stream)
    closed = llm.stream("hello")
    closed.close()
    with pytest.raises(StreamConsumedError):
        list(closed)


def test_closed_client_refuses(llm):
    llm.close()
    with pytest.raises(HybridLLMError, match="closed"):
        llm.chat("hi")


def test_eight_threads_share_one_client():
    backend = FakeBackend(reply=lambda m: f"answer to {m[-1]['content']}", delay_s=0.002)
    with HybridLLM(edge=backend, cache=False) as llm:
        results: dict[int, str] = {}

        def ask(i: int) -> None:
            results[i] = llm.chat(f"q{i}").text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert results == {i: f"answer to q{i}" for i in range(8)}
        assert llm.stats()["requests"] == 8


def test_requests_wait_their_turn_in_order():
    order: list[str] = []

    def reply(msgs):
        order.append(msgs[-1]["content"])
        return "a b c d"

    with HybridLLM(edge=FakeBackend(reply=reply, delay_s=0.02), cache=False) as llm:
        first = llm.stream("first")
        it = iter(first)
        next(it)  # the first request owns the device now
        threads = []
        for name in ("second", "third", "fourth"):
            threads.append(threading.Thread(target=llm.chat, args=(name,)))
            threads[-1].start()
            time.sleep(0.05)  # arrive in this order
        for t in threads:
            t.join(timeout=30)
        first.close()
    assert order == ["first", "second", "third", "fourth"]


def test_a_second_stream_on_the_same_thread_does_not_deadlock(llm):
    """Before: the edge held a lock across yield, so this blocked forever (or 15 s per thread)."""
    open_stream = llm.stream("hello")
    it = iter(open_stream)
    next(it)
    assert llm.chat("again").text == "one two three four five"
    assert "".join(ch.text for ch in it) == " two three four five"


def test_waiting_is_bounded_with_a_specific_error():
    slow = FakeBackend(reply=lambda m: " ".join(["w"] * 50), delay_s=0.02)  # ~1 s an answer
    with HybridLLM(edge=slow, cache=False, edge_wait_timeout_s=0.2, edge_max_waiting=1) as llm:
        busy = threading.Thread(target=llm.chat, args=("long",))
        busy.start()
        time.sleep(0.1)
        t0 = time.perf_counter()
        with pytest.raises(EdgeBusyError, match="busy for 0.2 s"):
            llm.chat("short")
        assert time.perf_counter() - t0 < 0.9  # gave up at the timeout, not after the answer
        waiting = threading.Thread(target=lambda: pytest.raises(EdgeBusyError, llm.chat, "w"))
        waiting.start()
        time.sleep(0.05)
        with pytest.raises(EdgeBusyError, match="already wait"):
            llm.chat("one too many")
        busy.join(timeout=10)
        waiting.join(timeout=10)


def test_async_matches_sync(llm):
    async def run():
        allm = AsyncHybridLLM.wrap(llm)
        c = await allm.chat("hello")
        stream = allm.stream("hello")
        chunks = [ch async for ch in stream]
        return c, chunks, stream.completion, allm.stats()

    c, chunks, completion, stats = asyncio.run(run())
    assert c.text == llm.chat("hello").text == "".join(ch.text for ch in chunks)
    assert chunks[-1].completion is completion and completion.finish_reason == "stop"
    assert stats["requests"] == 2


def test_async_client_is_native_and_needs_no_thread_per_stream():
    async def run():
        async with AsyncHybridLLM(edge=FakeBackend(delay_s=0.001), cache=False) as allm:
            with pytest.raises(InvalidRequestError):
                allm.stream([])  # at the call
            before = threading.active_count()
            streams = [allm.stream(f"q{i}") for i in range(16)]
            iters = [s.__aiter__() for s in streams]
            firsts = await asyncio.gather(*(anext(it) for it in iters))
            during = threading.active_count()
            for it in iters:
                async for _ in it:
                    pass
            return before, during, [f.text for f in firsts], [s.completion.text for s in streams]

    before, during, firsts, texts = asyncio.run(run())
    assert during <= before + 2  # the device thread (and at most one pool thread)
    assert firsts == ["echo:"] * 16 and texts == [f"echo: q{i}" for i in range(16)]


def test_async_stream_errors_propagate():
    async def run():
        async with AsyncHybridLLM(edge=FakeBackend(fail=HybridLLMError("boom")), cache=False) as a:
            return [ch async for ch in a.stream("x")]

    with pytest.raises(HybridLLMError, match="boom"):
        asyncio.run(run())


def test_closing_the_client_stops_the_device_before_freeing_it():
    backend = FakeBackend(reply=lambda m: " ".join(["w"] * 500), delay_s=0.01)
    llm = HybridLLM(edge=backend, cache=False)
    it = iter(llm.stream("go"))
    next(it)
    llm.close()  # the worker is mid-answer: it stops at its next token, then the model is freed
    stopped_at = backend.tokens_generated
    time.sleep(0.1)
    assert stopped_at < 100 and backend.tokens_generated == stopped_at


def test_an_async_stream_is_read_once_too():
    async def run():
        async with AsyncHybridLLM(edge=FakeBackend(), cache=False) as allm:
            async with allm.stream("hi") as stream:
                text = "".join([ch.text async for ch in stream])
            with pytest.raises(StreamConsumedError):
                stream.__aiter__()
            return text, stream.completion.text

    text, done = asyncio.run(run())
    assert text == done == "echo: hi"


def test_a_sync_edge_answer_is_generated_on_the_reading_thread():
    # the sync fast path: no thread hop per token (the async client generates on the worker)
    threads: list[int] = []

    class Spy(FakeBackend):
        def stream(self, messages, params):
            for delta in super().stream(messages, params):
                threads.append(threading.get_ident())
                yield delta

    with HybridLLM(edge=Spy(reply=lambda m: "one two three"), cache=False) as llm:
        with llm.stream("hi") as s:
            text = "".join(c.text for c in s)
        assert text == "one two three" and s.completion is not None and s.completion.usage.completion_tokens
        assert set(threads) == {threading.get_ident()}
        assert llm.stats()["requests"] == 1
        threads.clear()
        asyncio.run(AsyncHybridLLM.wrap(llm).chat("hi again"))
        assert threads and threading.get_ident() not in threads


def test_a_stream_read_after_its_client_closed_raises_a_hybridllm_error():
    """Before: a bare RuntimeError('the client is closed'), which `except HybridLLMError` missed."""
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "a b c"), cache=False)
    stream = llm.stream("hi")
    llm.close()
    llm.close()  # twice is fine
    with pytest.raises(HybridLLMError, match="closed"):
        list(stream)
    with pytest.raises(HybridLLMError, match="closed"):
        llm.chat("hi")


def test_an_answer_cut_off_by_close_is_an_error_not_a_shorter_answer():
    """close() from another thread (or the interpreter's exit) while the device answers: the
    reader gets an error, never a truncated text passed off as finished (finish_reason 'stop'),
    and never waits for ever (the sync reader used to wait for a step on the stopped loop); a
    request still waiting its turn is told the device closed (it used to wait edge_wait_timeout_s)."""
    cut = "closed (before this answer was complete|while the device model was answering)"

    def slow(started: threading.Event) -> FakeBackend:  # reply() is called as generation starts
        return FakeBackend(reply=lambda m: (started.set(), " ".join(["w"] * 500))[1], delay_s=0.01)

    for path in ("chat", "stream"):  # the sync client: the answer is generated on the reader's thread
        started = threading.Event()
        llm = HybridLLM(edge=slow(started), cache=False)
        got: dict[str, object] = {}

        def read(llm: HybridLLM = llm, got: dict[str, object] = got, path: str = path) -> None:
            try:
                got["answer"] = (llm.chat("go") if path == "chat"
                                 else "".join(c.text for c in llm.stream("go")))
            except HybridLLMError as exc:
                got["error"] = exc

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert started.wait(10)
        llm.close()
        reader.join(10)
        assert not reader.is_alive(), f"{path}: the reader still waits after close()"
        assert "answer" not in got and re.search(cut, str(got["error"])), (path, got)

    async def run() -> None:  # the async client: generated on the device's worker thread
        started = threading.Event()
        allm = AsyncHybridLLM(edge=slow(started), cache=False, edge_wait_timeout_s=60)
        answering = asyncio.ensure_future(allm.chat("go"))
        waiting = asyncio.ensure_future(allm.chat("go on"))  # queued behind it
        while not started.is_set():
            await asyncio.sleep(0.01)
        await allm.aclose()
        done, _ = await asyncio.wait({answering, waiting}, timeout=10)
        assert len(done) == 2, "a request still waits after aclose()"
        with pytest.raises(HybridLLMError, match=cut):
            answering.result()
        with pytest.raises(HybridLLMError, match=cut):  # as the sync client says (aclose stops it)
            waiting.result()

    asyncio.run(run())
    with HybridLLM(edge=FakeBackend(reply=lambda m: "a b c"), cache=False) as done:  # a whole one
        assert done.chat("go").finish_reason == "stop"


def test_closing_a_stream_while_the_client_closes_raises_nothing_foreign():
    """A reader closing its stream while another thread closes the client: its close was
    cancelled with the client's tasks, and concurrent.futures' CancelledError (not asyncio's)
    escaped Stream.close() to the user."""
    from hybridllm._types import Usage
    from hybridllm.backends.base import Delta

    class SlowToCloseCloud(FakeBackend):
        async def astream(self, messages, params):
            try:
                for i in range(1000):
                    await asyncio.sleep(0.01)
                    yield Delta(f" w{i}")
                yield Delta("", finish_reason="stop", usage=Usage(1, 1))
            finally:
                await asyncio.sleep(1.0)  # a connection torn down politely

    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "edge"), cloud=SlowToCloseCloud(model="c"), cache=False)
    reading, got = threading.Event(), {}

    def read() -> None:
        try:
            with llm.stream("hi", route="cloud") as s:
                for i, _ in enumerate(s):
                    reading.set()
                    if i == 5:
                        s.close()  # takes a second: the client closes meanwhile
                        break
        except BaseException as exc:  # noqa: BLE001 - what the user would see
            got["error"] = exc

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert reading.wait(10)
    time.sleep(0.3)
    llm.close()
    reader.join(15)
    assert not reader.is_alive() and "error" not in got, got
