"""A closed device stream stops at the model's next token, text or none (review 21).

The worker noticed a close only after the next delta it passed on, and the device backends yield
a delta only for a token with text: tokens without text of their own (special tokens, the first
bytes of a character) or with text held back as the possible start of a stop string went on being
decoded for nobody (up to max_tokens), the device busy and the next request waiting. Here the
backends' own token loops run on fake models that count their steps; every model below blocks in
its second step until the test has closed the stream, so "one step after the close" is exact.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
import types
from collections.abc import Iterator

import numpy as np
import pytest

from hybridllm import EdgeError, GenerationParams
from hybridllm._types import Usage
from hybridllm.backends.base import Delta
from hybridllm.backends.worker import EdgeWorker

TEXT, SILENT, EQ, EOS = 1, 2, 3, 9  # "a"; a token without text; "="; end of answer
STOP = "=" * 40  # a long stop string the model keeps almost writing
PIECES = {TEXT: "a", SILENT: "", EQ: "="}


class _Script:
    """The model's tokens: "a", then ``then`` over and over; its step 1 waits for ``go``."""

    def __init__(self, then: int) -> None:
        self.then = then
        self.steps = 0
        self.in_step_1 = threading.Event()  # the second token is being decoded
        self.go = threading.Event()

    def token(self) -> int:
        self.steps += 1
        if self.steps == 2:
            self.in_step_1.set()
            assert self.go.wait(5)
        return TEXT if self.steps == 1 else self.then


# -- the llama.cpp backend's token loop on a fake llama_cpp.Llama ----------------------------------
class _Llm:
    def __init__(self, script: _Script) -> None:
        self.script = script
        self._model = types.SimpleNamespace(vocab=None)
        # finite logits: the backend reads the drawn token's own (a NaN one is refused)
        self._ctx = types.SimpleNamespace(get_logits=lambda: (ctypes.c_float * 16)())

    def set_seed(self, seed: int) -> None:
        pass

    def generate(self, tokens, **kw) -> Iterator[int]:
        while True:
            yield self.script.token()


def _llama(monkeypatch, script: _Script):
    L = pytest.importorskip("hybridllm.backends.llama_cpp")
    C = pytest.importorskip("llama_cpp").llama_cpp
    monkeypatch.setattr(C, "llama_vocab_is_eog", lambda vocab, tok: tok == EOS)
    monkeypatch.setattr(L, "llama_bytes", lambda llm, ids, special=False:
                        "".join(PIECES[i] for i in ids).encode())
    monkeypatch.setattr(L, "_prefill_head", lambda llm, tokens: None)
    edge = L.LlamaCppBackend.__new__(L.LlamaCppBackend)
    edge._busy, edge._gate, edge._llm, edge._n_ctx, edge._n_vocab = (
        threading.Lock(), L._Gate(), _Llm(script), 100_000, 16)
    edge.n_threads = 1
    return edge


# -- the ONNX backend's token loop on fake logits -------------------------------------------------
def _onnx(monkeypatch, script: _Script):
    onnx = pytest.importorskip("hybridllm.backends.onnx")
    edge = onnx.OnnxBackend.__new__(onnx.OnnxBackend)
    edge._model, edge._n_ctx, edge._lock, edge._eos_ids = object(), 100_000, threading.Lock(), {EOS}
    edge._tok = types.SimpleNamespace(
        create_stream=lambda: types.SimpleNamespace(decode=lambda t: PIECES[t]))

    def logits(seq, closed_message):
        row = np.zeros(16, dtype=np.float32)
        row[script.token()] = 50.0
        return row

    edge._logits = logits
    return edge


BACKENDS = {"llama_cpp": _llama, "onnx": _onnx}
CASES = [pytest.param(SILENT, id="tokens-without-text"), pytest.param(EQ, id="held-back-stop-prefix")]


def _params() -> GenerationParams:
    return GenerationParams(max_tokens=5_000, temperature=0, stop=[STOP])


def _make(edge):
    return lambda: edge._run([5, 6], _params(), (STOP,))  # the token loop, as stream() calls it


def _quick():
    yield Delta("next", finish_reason="stop", usage=Usage(1, 1))


async def _read(deltas) -> list[str]:
    return [d.text async for d in deltas]


@pytest.mark.parametrize("then", CASES)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_closed_async_stream_stops_the_model_at_its_next_token(monkeypatch, backend, then):
    """Before: the model decoded on up to max_tokens (5,000 steps here) after the close, and the
    closing reader's aclose() waited for all of them."""
    script = _Script(then)
    edge = BACKENDS[backend](monkeypatch, script)

    async def main():
        worker = EdgeWorker(edge, wait_timeout_s=5.0)
        stream = worker.stream(_make(edge))
        assert (await asyncio.wait_for(stream.__anext__(), 5)).text == "a"
        # the model is in its second step when the stream closes: without this wait a slow worker
        # thread saw the close before its second step and stopped after one (seen once: 1 != 2)
        assert await asyncio.get_running_loop().run_in_executor(None, script.in_step_1.wait, 5)
        closing = asyncio.ensure_future(stream.aclose())
        await asyncio.sleep(0)  # the job is cancelled before aclose() waits for the worker
        script.go.set()
        await asyncio.wait_for(closing, 5)
        assert script.steps == 2  # the token being decoded when the stream closed, no more
        assert await asyncio.wait_for(_read(worker.stream(_quick)), 5) == ["next"]
        assert worker.close(5)

    asyncio.run(main())


@pytest.mark.parametrize("then", CASES)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_sync_stream_closed_from_another_thread_stops_at_the_next_token(monkeypatch, backend, then):
    """The sync client's answer runs on the reader's thread; ``Stream.close()`` from another thread
    cancels the run. Before: the reader's thread decoded on to max_tokens before it saw it."""
    script = _Script(then)
    edge = BACKENDS[backend](monkeypatch, script)

    async def main():
        loop = asyncio.get_running_loop()
        worker = EdgeWorker(edge, wait_timeout_s=5.0)
        run = worker.inline(_make(edge), lambda d: d.text or None, lambda: "finished")

        def read_then_generate_directly():
            chunks, steps = list(run.chunks()), script.steps
            # the cancelled run no longer applies on this thread: a direct stream runs to its end
            script.then, script.steps = EQ, 0
            return chunks, steps, "".join(d.text for d in _make(edge)())

        reading = loop.run_in_executor(None, read_then_generate_directly)
        assert await loop.run_in_executor(None, script.in_step_1.wait, 5)
        run.cancel()  # what Stream.close() does from another thread
        script.go.set()
        assert await asyncio.wait_for(reading, 5) == (["a"], 2, "a")
        assert script.steps == 1 + len(STOP)
        assert isinstance(run._error, EdgeError) and "incomplete" in str(run._error)
        assert worker.close(5)

    asyncio.run(main())


@pytest.mark.parametrize("then", CASES)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_sync_reader_leaving_after_the_worker_took_over_stops_the_model(monkeypatch, backend, then):
    """Another request arrived, so the worker took the idle reader's token loop over; the reader
    then left. Before: the worker decoded on to max_tokens, the waiting request behind it."""
    script = _Script(then)
    edge = BACKENDS[backend](monkeypatch, script)

    async def main():
        loop = asyncio.get_running_loop()
        worker = EdgeWorker(edge, wait_timeout_s=5.0)
        run = worker.inline(_make(edge), lambda d: d.text or None, lambda: "finished")
        chunks = run.chunks()
        assert await loop.run_in_executor(None, next, chunks) == "a"
        waiting = asyncio.ensure_future(_read(worker.stream(_quick)))  # the worker takes over
        assert await loop.run_in_executor(None, script.in_step_1.wait, 5)
        await loop.run_in_executor(None, chunks.close)  # the reader leaves
        script.go.set()
        assert await asyncio.wait_for(waiting, 5) == ["next"]
        assert script.steps == 2
        assert worker.close(5)

    asyncio.run(main())


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_stream_read_to_its_end_is_unchanged(monkeypatch, backend):
    """Nobody closes: the answer runs to its stop string, held-back text and all."""
    script = _Script(EQ)
    script.go.set()
    edge = BACKENDS[backend](monkeypatch, script)
    deltas = list(_make(edge)())
    assert "".join(d.text for d in deltas) == "a" and deltas[-1].finish_reason == "stop"
    assert script.steps == 1 + len(STOP)
