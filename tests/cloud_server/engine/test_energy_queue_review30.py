"""A request's energy share starts when the engine first schedules it, not at its admission.

The meter splits the energy read between two events equally among the active requests; a
request counted from its admission took a share of the steps it only waited through (behind a
full batch), and the requests that ran them got less. Fake model, an estimate source on a clock
that each model step moves by one second (1 J a step at 1 W).
"""

from __future__ import annotations

import asyncio

from cloud_server.api.generation import Generation, Prepared
from cloud_server.api.metrics import RequestTimer, ServerMetrics
from cloud_server.config import EngineConfig
from cloud_server.energy import EnergyAccounting, EnergyMeter
from cloud_server.energy_sources import EstimateSource
from cloud_server.engine.async_engine import AsyncLLMEngine
from cloud_server.engine.sampling_params import SamplingParams

from .test_fuzz_fake_batching8 import make_engine

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)  # 4 steps a request


def _meter() -> tuple[EnergyMeter, list[float]]:
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    return EnergyMeter(EstimateSource(1.0, clock), 1.0, clock=clock), now


def test_a_queued_request_gets_no_share_until_it_is_started():
    meter, now = _meter()
    running, queued, never = meter.begin(), meter.begin(queued=True), meter.begin(queued=True)
    now[0] += 3  # only "running" runs
    meter.started(queued)
    now[0] += 2  # both run
    assert meter.end(never) == 0.0  # it never ran: no share, and no one's share moved
    assert meter.end(running) == 3 + 1
    now[0] += 5
    assert meter.end(queued) == 1 + 5
    meter.started(queued)  # once only: an ended key does not come back
    assert meter.attributed_joules == 10


def _engine(now: list[float]):
    """One request runs at a time: the second waits in the queue through the first one's steps."""
    eng = make_engine(8, max_num_seqs=1)
    real = eng.runner.execute

    def execute(scheduled, **kw):
        now[0] += 1.0
        return real(scheduled, **kw)

    eng.runner.execute = execute
    return eng


def test_an_engine_request_counts_from_its_first_step():
    meter, now = _meter()
    eng = _engine(now)
    keys = {rid: meter.begin(queued=True) for rid in ("a", "b")}
    starts: list[str] = []

    def on_scheduled(rid):
        def fn():
            starts.append(rid)
            meter.started(keys[rid])
        return fn

    for rid in keys:
        eng.add_request(rid, [1, 2, 3], PARAMS, on_scheduled=on_scheduled(rid))
    joules = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                joules[out.request_id] = meter.end(keys[out.request_id])
    assert starts == ["a", "b"]  # each once
    assert joules == {"a": 4.0, "b": 4.0}  # admitted at once, "b" shared none of "a"'s steps


def test_a_served_request_that_waited_does_not_pay_for_the_steps_before_it():
    """Through the server's Generation and the async engine (the engine thread calls back)."""
    meter, now = _meter()
    metrics = ServerMetrics(lambda: None, lambda: "m")
    energy = EnergyAccounting(meter, metrics.registry, lambda: "m")

    async def one(engine, rid):
        prepared = Prepared("completion", rid, [1, 2, 3], PARAMS, stream=False, include_usage=True,
                            created=0)
        gen = Generation(engine, prepared, RequestTimer(metrics, "m"), energy=energy)
        try:
            await gen.admit()
            return [out async for out in gen.outputs()][-1].energy["joules"]
        finally:
            await gen.close()

    async def main():
        engine = AsyncLLMEngine(EngineConfig(model="stub", max_waiting=1000), engine=_engine(now))
        await engine.start()
        try:
            return await asyncio.wait_for(asyncio.gather(one(engine, "a"), one(engine, "b")), 10)
        finally:
            await engine.stop()

    a, b = asyncio.run(main())
    assert a + b == 8.0  # every step's joule, to someone
    # "a" ran alone for 4 steps; its end may be read a step late, during "b"'s first (shared);
    # counted from admission, "b" took half of "a"'s 4 steps (a = 2, b = 6)
    assert a >= 4.0 and b <= 4.0, (a, b)
