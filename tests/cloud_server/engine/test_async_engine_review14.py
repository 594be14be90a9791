"""The async engine with two streams of one request id made before either is read, and with a
failed step while other requests only wait (fake model, fast)."""

from __future__ import annotations

import asyncio

import pytest

from cloud_server.config import EngineConfig
from cloud_server.engine.async_engine import AsyncLLMEngine
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import EngineError, InvalidRequestError
from tests.cloud_server.engine.test_fuzz_fake_batching8 import make_engine

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


async def _consume(gen):
    try:
        return [o async for o in gen]
    except Exception as exc:  # noqa: BLE001 - the outcome is what the test reads
        return exc


def test_a_second_stream_of_the_same_id_is_refused_and_the_first_still_ends() -> None:
    async def main():
        engine = AsyncLLMEngine(EngineConfig(model="stub", max_waiting=1000), engine=make_engine(8))
        await engine.start()
        try:
            first = engine.generate("same", [1, 2, 3], PARAMS)
            second = engine.generate("same", [4, 5, 6], PARAMS)  # neither is read yet: both pass
            return await asyncio.wait_for(asyncio.gather(_consume(first), _consume(second)), 10)
        finally:
            await engine.stop()

    first, second = asyncio.run(main())  # the old code: the first stream waited for ever
    assert isinstance(second, InvalidRequestError) and "duplicate" in str(second)
    assert isinstance(first, list) and first[-1].finished
    assert sum(len(o.delta_token_ids) for o in first) == 4


def test_a_failed_step_fails_its_batch_not_the_requests_that_only_waited() -> None:
    eng = make_engine(8, max_num_seqs=1)  # one request runs at a time: "b" waits behind "a"
    real, calls = eng.runner.execute, [0]

    def execute(scheduled, **kw):
        calls[0] += 1
        if calls[0] == 2:  # "a"'s second step: a passing failure (an out-of-memory)
            raise RuntimeError("transient out of memory")
        return real(scheduled, **kw)

    eng.runner.execute = execute

    async def main():
        engine = AsyncLLMEngine(EngineConfig(model="stub", max_waiting=1000), engine=eng)
        await engine.start()
        try:
            return await asyncio.wait_for(asyncio.gather(
                _consume(engine.generate("a", [1, 2, 3], PARAMS)),
                _consume(engine.generate("b", [4, 5, 6], PARAMS))), 10)
        finally:
            await engine.stop()

    ran, waited = asyncio.run(main())
    assert isinstance(ran, EngineError) and "model step failed" in str(ran)
    # the old code failed "b" too, though no step had run it
    assert isinstance(waited, list) and waited[-1].finished, waited
    assert sum(len(o.delta_token_ids) for o in waited) == 4
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


@pytest.mark.parametrize("request_ids", [None, ["x"]])
def test_an_engine_error_names_its_batch_or_none(request_ids) -> None:
    assert EngineError("m", request_ids=request_ids).request_ids == request_ids
