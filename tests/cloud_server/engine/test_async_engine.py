"""AsyncLLMEngine on the real SmolLM2: streaming, early exit aborts, validation errors."""

from __future__ import annotations

import asyncio

import pytest

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import ContextLengthError, EngineError, QueueFullError

pytestmark = pytest.mark.real


@pytest.fixture
def engine(smollm2_engine):
    import dataclasses

    from cloud_server.engine.async_engine import AsyncLLMEngine

    config = dataclasses.replace(smollm2_engine.config, max_waiting=4)
    yield AsyncLLMEngine(config, engine=smollm2_engine)
    assert not smollm2_engine.has_unfinished()
    bm = smollm2_engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_streams_concurrent_requests_and_matches_sync(engine, smollm2_engine):
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Say hi"}])
    expected = smollm2_engine.generate([prompt], params)[0]

    async def collect(rid):
        text, ids, last = "", [], None
        async for out in engine.generate(rid, prompt, params):
            text, ids, last = text + out.delta_text, ids + out.delta_token_ids, out
        return text, ids, last

    async def main():
        await engine.start()
        assert engine.is_ready and engine.model_name == "SmolLM2-135M-Instruct.Q4_1"
        results = await asyncio.gather(*(collect(f"r{i}") for i in range(3)))
        await engine.stop()
        return results

    for text, ids, last in asyncio.run(main()):
        assert ids == expected.token_ids and text == expected.text
        assert last.finished and last.finish_reason == "length" and last.num_output_tokens == 8


def test_leaving_early_aborts_and_frees_blocks(engine, smollm2_engine):
    async def main():
        await engine.start()
        stream = engine.generate("a", "Count to one hundred:", SamplingParams(max_tokens=200))
        async for out in stream:
            if out.num_output_tokens >= 2:
                break
        await stream.aclose()
        second = engine.generate("b", "Hello", SamplingParams(max_tokens=200))
        await second.__anext__()
        await engine.abort("b")
        assert smollm2_engine.stats()["num_running"] == 0
        reasons = [out.finish_reason async for out in second]  # queued outputs, then "abort"
        assert reasons[-1] == "abort"
        await asyncio.sleep(0.05)
        await engine.stop()

    asyncio.run(main())


def test_validation_errors_raise_at_call(engine, smollm2_engine):
    """A full waiting queue, made of real requests: one batch slot, so the rest wait."""
    long = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

    async def main():
        await engine.start()
        with pytest.raises(ContextLengthError):
            engine.generate("c", "Hi", SamplingParams(max_tokens=10_000))
        saved = smollm2_engine.scheduler.max_num_seqs
        smollm2_engine.scheduler.max_num_seqs = 1
        streams = [engine.generate(f"q{i}", "Count to one hundred:", long) for i in range(5)]
        firsts = [asyncio.ensure_future(s.__anext__()) for s in streams]
        try:
            await firsts[0]  # one runs; the other four wait in the engine's queue
            while len(smollm2_engine.scheduler.waiting) < 4:
                await asyncio.sleep(0.01)
            with pytest.raises(QueueFullError):
                engine.generate("d", "Hi", SamplingParams(max_tokens=4))
        finally:
            smollm2_engine.scheduler.max_num_seqs = saved
            for f in firsts:
                f.cancel()
            await asyncio.gather(*firsts, return_exceptions=True)
            for i, s in enumerate(streams):
                await s.aclose()
                await engine.abort(f"q{i}")  # returns once its blocks are back
        await engine.stop()

    asyncio.run(main())


def test_a_failure_of_one_request_ends_that_request_only(engine):
    """A row whose sampling fails (a setting that slipped past validation) fails alone."""
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Name a color."}])

    async def collect(rid, p):
        ids = []
        async for out in engine.generate(rid, prompt, p):
            ids += out.delta_token_ids
        return ids, out.finish_reason

    async def main():
        await engine.start()
        poisoned = SamplingParams(temperature=1.0, max_tokens=12)
        poisoned.temperature = float("nan")
        results = await asyncio.gather(
            *(collect(f"ok{i}", params) for i in range(3)), collect("bad", poisoned),
            return_exceptions=True,
        )
        await engine.stop()
        return results

    *good, bad = asyncio.run(main())
    assert isinstance(bad, EngineError) and "ValueError" in str(bad)
    for ids, reason in good:
        assert len(ids) == 12 and reason == "length"


def test_every_step_runs_on_one_thread_while_the_shared_pool_grows(engine, smollm2_engine):
    """torch keeps a spinning worker team per calling thread: steps must not hop between threads.

    Requests prepared concurrently in asyncio's shared pool (as the server does) grow that pool;
    the engine's steps still all run on its own single thread.
    """
    import threading
    import time

    step_threads: set[int] = set()
    real_step = smollm2_engine.step

    def recording_step():
        step_threads.add(threading.get_ident())
        return real_step()

    smollm2_engine.step = recording_step
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)

    async def one(rid):
        await asyncio.to_thread(time.sleep, 0.05)  # occupies a pool thread, as a prepare does
        async for _ in engine.generate(rid, "Hello there", params):
            await asyncio.gather(*(asyncio.to_thread(time.sleep, 0.001) for _ in range(4)))

    async def main():
        await engine.start()
        await asyncio.gather(*(one(f"t{i}") for i in range(4)))
        await engine.stop()

    try:
        asyncio.run(main())
    finally:
        del smollm2_engine.step
    assert len(step_threads) == 1
    assert threading.get_ident() not in step_threads
