"""A stream dropped half read, without close(), stops its answer at once (CPython refcounting), not
at the next cyclic garbage collection. A sync Stream read with next() kept its reader generator on
itself while that generator's frame held the stream: a cycle. Dropped, it lived on until the
garbage collector ran; meanwhile its device answer held its turn, and the next request waited for
the worker to generate the rest of the abandoned answer (up to max_tokens) for no one."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import weakref
from collections.abc import Iterator

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM, StreamConsumedError
from hybridllm.backends.fake import FakeBackend

LONG = 300  # words (tokens) of the abandoned answer


@pytest.fixture
def no_gc() -> Iterator[list[object]]:
    """No cyclic garbage collection while the test runs; collects what was reported unraisable."""
    unraisable: list[object] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda info: unraisable.append(f"{info.exc_value!r} in {info.object!r}")
    gc.collect()
    gc.disable()
    try:
        yield unraisable
    finally:
        gc.enable()
        sys.unraisablehook = hook


def _edge() -> FakeBackend:
    return FakeBackend(reply=lambda _m: " ".join(["w"] * LONG), delay_s=0.001)


def _second(llm: HybridLLM, edge: FakeBackend) -> int:
    """Serve another device request; the tokens the device generated meanwhile."""
    before = edge.tokens_generated
    edge.reply = lambda _m: "second"
    assert llm.chat("again", route="edge", max_tokens=LONG).text == "second"
    return edge.tokens_generated - before


def test_a_stream_read_with_next_and_dropped_frees_the_device_at_once(no_gc):
    edge = _edge()
    with HybridLLM(edge=edge, cloud=FakeBackend(reply=lambda _m: "x"), cache=False) as llm:
        s = llm.stream("go", route="edge", max_tokens=LONG)
        assert next(s).text == "w"
        alive = weakref.ref(s)
        del s
        assert alive() is None, "a dropped stream lived on until the next garbage collection"
        # the second answer's one token, not the 299 left of the dropped one first
        assert _second(llm, edge) < 20
    assert no_gc == []


def test_next_on_a_stream_never_kept_stops_its_answer(no_gc):
    edge = _edge()
    with HybridLLM(edge=edge, cache=False) as llm:
        assert next(llm.stream("go", route="edge", max_tokens=LONG)).text == "w"
        assert _second(llm, edge) < 20
    assert no_gc == []


@pytest.mark.parametrize("route", ["edge", "cloud"])
def test_a_dropped_half_read_stream_is_not_kept_by_a_cycle(no_gc, route):
    with HybridLLM(edge=_edge(), cloud=_edge(), cache=False) as llm:
        s = llm.stream("go", route=route, max_tokens=LONG)
        next(s)
        alive = weakref.ref(s)
        del s
        assert alive() is None
        assert llm.chat("again", route=route, max_tokens=3).text == "w w w"
    assert no_gc == []


@pytest.mark.parametrize("how", ["break", "iter-next"])
def test_plain_iteration_left_half_way_frees_the_device(no_gc, how):
    edge = _edge()
    with HybridLLM(edge=edge, cache=False) as llm:
        s = llm.stream("go", route="edge", max_tokens=LONG)
        if how == "break":
            for _chunk in s:
                break
        else:
            it = iter(s)
            next(it)
            del it
        del s
        assert _second(llm, edge) < 20
    assert no_gc == []


def test_the_with_form_and_next_then_for_still_read_the_whole_answer(no_gc):
    edge = FakeBackend(reply=lambda _m: "one two three four")
    with HybridLLM(edge=edge, cache=False) as llm:
        with llm.stream("go", route="edge") as s:
            text = next(s).text
            for chunk in s:
                text += chunk.text
        assert text == "one two three four"
        assert s.completion is not None and s.completion.text == text
        with pytest.raises(StopIteration):
            next(s)
        with llm.stream("go", route="edge", max_tokens=LONG) as s2:
            assert next(s2).text == "one"
        assert s2.completion is None
        assert llm.chat("go", route="edge").text == "one two three four"
    assert no_gc == []


@pytest.mark.parametrize("how", ["anext", "break", "break-keep"])
def test_an_async_stream_left_half_way_frees_the_device(no_gc, how):
    edge = _edge()

    async def main() -> int:
        async with AsyncHybridLLM(edge=edge, cache=False) as llm:
            s = llm.stream("go", route="edge", max_tokens=LONG)
            if how == "anext":
                await anext(s)
            else:
                async for _chunk in s:
                    break
            if how != "break-keep":
                del s
            before = edge.tokens_generated
            edge.reply = lambda _m: "second"
            assert (await llm.chat("again", route="edge")).text == "second"
            return edge.tokens_generated - before

    assert asyncio.run(main()) < 20
    assert no_gc == []


class _Gated(FakeBackend):
    """Streams five words; the second waits for ``gate``."""

    def __init__(self) -> None:
        super().__init__(reply=lambda _m: " ".join(["w"] * 5))
        self.gate = threading.Event()
        self.waiting = threading.Event()

    def stream(self, messages, params):  # type: ignore[no-untyped-def]
        for i, delta in enumerate(super().stream(messages, params)):
            if i == 1:
                self.waiting.set()
                self.gate.wait(10)
            yield delta


@pytest.mark.parametrize("route", ["edge", "cloud"])
def test_a_for_loop_while_another_thread_is_in_next_is_refused_and_its_answer_left_whole(route):
    gated = _Gated()
    with HybridLLM(edge=gated, cloud=gated, cache=False) as llm:
        s = llm.stream("go", route=route)
        text = [next(s).text]
        got: dict[str, object] = {}

        def read() -> None:
            try:
                while True:
                    text.append(next(s).text)
            except StopIteration:
                got["end"] = True
            except BaseException as exc:  # noqa: BLE001 - what the reader gets is the test
                got["error"] = exc

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert gated.waiting.wait(10)
        try:
            with pytest.raises(StreamConsumedError, match="another thread"):
                for _chunk in s:  # (a ValueError "generator already executing", and the answer cut)
                    pass
        finally:
            gated.gate.set()
            reader.join(10)
        assert got == {"end": True}
        assert "".join(text) == "w w w w w" and s.completion is not None


def test_a_for_loop_after_next_does_not_end_as_complete_when_closed_half_way():
    with HybridLLM(edge=FakeBackend(reply=lambda _m: "a b c d e"), cache=False) as llm:
        s = llm.stream("go", route="edge")
        next(s)
        it = iter(s)
        next(it)
        s.close()  # (from another thread, between two chunks, it is the same)
        with pytest.raises(StreamConsumedError):
            next(it)  # it ended as if the answer were complete (StopIteration)
        assert s.completion is None


@pytest.mark.parametrize("route", ["edge", "cloud"])
def test_an_iterator_taken_before_another_thread_entered_next_is_refused_closing_nothing(route):
    """iter(s) while no thread reads, then another thread enters next(s): the iterator's read is
    refused and the other thread's answer stays whole (the refusal closed it after one chunk)."""
    gated = _Gated()
    with HybridLLM(edge=gated, cloud=gated, cache=False) as llm:
        s = llm.stream("go", route=route)
        text = [next(s).text]
        it = iter(s)  # no one reads yet: a for loop's iterator, allowed
        got: dict[str, object] = {}

        def read() -> None:
            try:
                while True:
                    text.append(next(s).text)
            except StopIteration:
                got["end"] = True
            except BaseException as exc:  # noqa: BLE001 - what the reader gets is the test
                got["error"] = exc

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert gated.waiting.wait(10)
        try:
            with pytest.raises(StreamConsumedError, match="another thread"):
                next(it)
        finally:
            gated.gate.set()
            reader.join(10)
        assert got == {"end": True}
        assert "".join(text) == "w w w w w" and s.completion is not None
