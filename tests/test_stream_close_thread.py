"""Stream.close() from another thread while a reader waits for the next chunk: the reader gets a
HybridLLMError that says the stream was closed (before: a cloud answer's reader got a bare
ValueError 'generator already executing', and a device answer's reader saw the answer end as if
finished), and the device stops at its next token (it decoded the whole answer first)."""

from __future__ import annotations

import threading
import time

import pytest

from hybridllm import HybridLLM, StreamConsumedError
from hybridllm.backends.fake import FakeBackend


@pytest.mark.parametrize("where", ["edge", "cloud"])
def test_a_stream_closed_from_another_thread_ends_its_reader_with_an_error(where):
    slow = FakeBackend(model=f"{where}-model", reply=lambda m: " ".join(["w"] * 400), delay_s=0.02)
    other = FakeBackend(reply=lambda m: "x")
    edge, cloud = (slow, other) if where == "edge" else (other, slow)
    with HybridLLM(edge=edge, cloud=cloud, cache=False) as llm:
        stream = llm.stream("go", route=where)
        got: dict[str, object] = {"text": []}
        first = threading.Event()

        def read() -> None:
            try:
                for chunk in stream:
                    got["text"].append(chunk.text)  # type: ignore[union-attr]
                    first.set()
                got["ended"] = True
            except BaseException as exc:  # noqa: BLE001 - what the reader gets is the test
                got["error"] = exc

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert first.wait(10)
        time.sleep(0.05)
        stream.close()
        reader.join(10)
        assert not reader.is_alive()
    assert "ended" not in got, f"a cut answer ended as if finished: {got}"
    assert isinstance(got.get("error"), StreamConsumedError), repr(got.get("error"))
    assert "closed" in str(got["error"])
    assert stream.completion is None
    # the device stopped at close(), not at the end of its 400-token answer (8 s)
    assert len(got["text"]) < 200, len(got["text"])  # type: ignore[arg-type]


@pytest.mark.real
def test_real_device_stops_when_its_stream_is_closed_from_another_thread(smollm2_path):
    from hybridllm.backends.base import create_backend

    edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=512, n_threads=1)
    with HybridLLM(edge=edge, cache=False) as llm:
        stream = llm.stream("Write a long story about a lighthouse keeper.", max_tokens=400,
                            temperature=0)
        got: dict[str, object] = {"text": []}
        first = threading.Event()

        def read() -> None:
            try:
                for chunk in stream:
                    got["text"].append(chunk.text)  # type: ignore[union-attr]
                    first.set()
                got["ended"] = True
            except BaseException as exc:  # noqa: BLE001 - what the reader gets is the test
                got["error"] = exc

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert first.wait(60)
        closed = time.perf_counter()
        stream.close()
        reader.join(30)
        stopped_s = time.perf_counter() - closed
        assert not reader.is_alive()
    assert isinstance(got.get("error"), StreamConsumedError), repr(got.get("error"))
    assert len(got["text"]) < 100 and stopped_s < 5, (len(got["text"]), stopped_s)  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["edge", "cloud"])
def test_an_async_stream_closed_from_another_task_ends_its_reader_with_an_error(where):
    """Before: aclose() from another task raised RuntimeError('aclose(): asynchronous generator is
    already running') to the closer, and the reader read the whole answer to its end."""
    import asyncio

    from hybridllm import AsyncHybridLLM

    async def run() -> dict[str, object]:
        slow = FakeBackend(model=f"{where}-model", reply=lambda m: " ".join(["w"] * 400), delay_s=0.02)
        other = FakeBackend(reply=lambda m: "x")
        edge, cloud = (slow, other) if where == "edge" else (other, slow)
        llm = AsyncHybridLLM(edge=edge, cloud=cloud, cache=False)
        stream = llm.stream("go", route=where)
        got: dict[str, object] = {"n": 0}

        async def read() -> None:
            try:
                async for _ in stream:
                    got["n"] += 1  # type: ignore[operator]
                got["ended"] = True
            except Exception as exc:  # noqa: BLE001 - what the reader gets is the test
                got["error"] = exc

        reader = asyncio.create_task(read())
        while not got["n"]:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        await stream.aclose()  # raised RuntimeError before
        await asyncio.wait_for(reader, 5)
        got["completion"] = stream.completion
        await llm.aclose()
        return got

    got = asyncio.run(run())
    assert "ended" not in got, f"a cut answer ended as if finished: {got}"
    assert isinstance(got.get("error"), StreamConsumedError), repr(got.get("error"))
    assert got["completion"] is None and got["n"] < 200, got  # type: ignore[operator]


def test_an_async_reader_cancelled_itself_still_gets_cancelled():
    """The reader's own task cancelled while it waits for a chunk: CancelledError, as before."""
    import asyncio

    from hybridllm import AsyncHybridLLM

    async def run() -> bool:
        slow = FakeBackend(model="cloud", reply=lambda m: " ".join(["w"] * 400), delay_s=0.02)
        llm = AsyncHybridLLM(edge=FakeBackend(reply=lambda m: "x"), cloud=slow, cache=False)

        async def read() -> None:
            async for _ in llm.stream("go", route="cloud"):
                pass

        reader = asyncio.create_task(read())
        await asyncio.sleep(0.2)
        reader.cancel()
        try:
            await reader
        except asyncio.CancelledError:
            return True
        finally:
            await llm.aclose()
        return False

    assert asyncio.run(run())
