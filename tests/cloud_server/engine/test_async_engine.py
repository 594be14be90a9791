"""AsyncLLMEngine on the real SmolLM2: streaming, early exit aborts, validation errors."""

from __future__ import annotations

import asyncio

import pytest

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import ContextLengthError, QueueFullError

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


def test_validation_errors_raise_at_call(engine):
    async def main():
        await engine.start()
        with pytest.raises(ContextLengthError):
            engine.generate("c", "Hi", SamplingParams(max_tokens=10_000))
        sched = engine.engine.scheduler  # simulate a full queue: every slot taken, 4 beyond
        sched.waiting.extend([None] * (sched.max_num_seqs + 4))
        try:
            with pytest.raises(QueueFullError):
                engine.generate("d", "Hi", SamplingParams(max_tokens=4))
        finally:
            engine.engine.scheduler.waiting.clear()
        await engine.stop()

    asyncio.run(main())
