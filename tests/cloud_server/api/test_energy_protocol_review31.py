"""Every engine the API runs on gets ``on_scheduled``, not only ``AsyncLLMEngine`` (review 31).

Before, ``Generation`` passed the energy meter's "started" call only to an ``AsyncLLMEngine``;
any other engine of the ``Engine`` protocol (the cluster's ``RemoteEngine``, a test fake) had its
request's share counted from admission, so the time it only waited in the queue was charged to
it. Now ``on_scheduled`` is part of the protocol and always passed; the remote engine calls it
at the replica's first output (once, whatever retries came before).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from cloud_server.api.generation import Generation, Prepared
from cloud_server.api.metrics import ServerMetrics
from cloud_server.energy import EnergyAccounting, EnergyMeter
from cloud_server.energy_sources import EstimateSource
from cloud_server.engine.sampling_params import SamplingParams


class QueueingEngine:
    """An engine of the protocol (no AsyncLLMEngine): its request waits 3 s in its queue, then
    runs 2 s; the clock is the meter's (1 W: a joule a second)."""

    is_ready = True
    model_name = "m"
    max_model_len = 64
    tokenizer: Any = None

    def __init__(self, now: list[float]) -> None:
        self.now = now
        self.given: list[dict[str, Any]] = []  # the keywords of each call

    def generate(self, request_id: str, prompt: Any, params: SamplingParams,
                 **kw: Any) -> AsyncIterator[Any]:
        self.given.append(kw)
        return self._run(request_id, kw.get("on_scheduled"))

    async def _run(self, request_id: str, on_scheduled: Callable[[], None] | None) -> AsyncIterator[Any]:
        self.now[0] += 3.0  # waits behind a full batch
        if on_scheduled is not None:
            on_scheduled()
        self.now[0] += 2.0  # runs
        yield SimpleNamespace(request_id=request_id, delta_text="hi", delta_token_ids=[1, 2],
                              finished=True, finish_reason="stop", num_prompt_tokens=3,
                              num_output_tokens=2)

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def abort(self, request_id: str) -> None: ...

    async def wait_dead(self) -> BaseException | None:
        return None

    def stats(self) -> dict[str, Any]:
        return {}


def _accounting() -> tuple[EnergyAccounting, list[float]]:
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    meter = EnergyMeter(EstimateSource(1.0, clock), 1.0, clock=clock)
    return EnergyAccounting(meter, CollectorRegistry(), lambda: "m"), now


def _prepared() -> Prepared:
    return Prepared(kind="chat", request_id="r1", prompt_ids=[1, 2, 3],
                    params=SamplingParams(max_tokens=2), stream=False, include_usage=False, created=0)


async def _run(engine: Any, energy: EnergyAccounting | None) -> Any:
    timer = ServerMetrics(lambda: None, lambda: "m").request_timer()
    generation = Generation(engine, _prepared(), timer, energy=energy)
    await generation.admit()
    outs = [out async for out in generation.outputs()]
    await generation.close()
    return outs[-1]


def test_an_engine_that_is_not_the_async_engine_gets_on_scheduled():
    energy, now = _accounting()
    engine = QueueingEngine(now)
    last = asyncio.run(_run(engine, energy))
    assert len(engine.given) == 1 and callable(engine.given[0].get("on_scheduled"))
    # its share: the 2 s it ran, not the 3 s it waited (5 J before)
    assert last.energy["joules"] == pytest.approx(2.0)
    assert energy.meter is not None and energy.meter.attributed_joules == pytest.approx(2.0)


def test_without_a_meter_the_engine_gets_none():
    engine = QueueingEngine([0.0])
    asyncio.run(_run(engine, None))
    assert engine.given == [{"on_scheduled": None}]  # passed all the same: part of the protocol


class _Handle:
    """A deployment handle whose replica dies before its first output once, then answers."""

    def __init__(self) -> None:
        self.calls = 0

    def options(self, **_: Any) -> _Handle:
        return self

    @property
    def generate(self) -> _Handle:
        return self

    def remote(self, prompt_ids: list[int], params: dict, request_id: str) -> Any:
        from ray.exceptions import ActorDiedError

        self.calls += 1
        first_call = self.calls == 1

        class Stream:
            def __aiter__(self) -> AsyncIterator[Any]:
                return self._gen()

            async def _gen(self) -> AsyncIterator[Any]:
                if first_call:
                    raise ActorDiedError()
                for i in range(3):
                    yield SimpleNamespace(i=i, request_id=request_id)

            def cancel(self) -> None:
                pass

        return Stream()


def test_the_remote_engine_calls_on_scheduled_once_at_the_first_output():
    pytest.importorskip("ray", reason="needs the [cluster] extra")
    from cloud_server.cluster.remote_engine import RemoteEngine

    engine = RemoteEngine(_Handle(), "m", retries=2)
    engine._ready = True
    engine.tokenizer = SimpleNamespace(encode=lambda text: [ord(c) for c in text])
    calls: list[int] = []

    async def collect() -> list[int]:
        seen = []
        stream = engine.generate("req", [1, 2], SamplingParams(max_tokens=3),
                                 on_scheduled=lambda: calls.append(len(seen)))
        async for out in stream:
            seen.append(out.i)
        return seen

    assert asyncio.run(collect()) == [0, 1, 2]
    assert calls == [0]  # once, before the first output went out; not for the failed try
