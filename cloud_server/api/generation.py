"""One admitted engine request: the ``Engine`` it runs on, its ``Prepared`` input, its ``Generation``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import EngineError, InvalidRequestError, QueueFullError

from .metrics import RequestTimer

# The engine's ends that are an answer; its others ("abort": dropped by the engine, "error") are
# no finish reason OpenAI's types allow, and the text they end is cut short: an error instead.
_ANSWER_ENDS = frozenset({"stop", "length", None})


class Engine(Protocol):
    """The part of ``AsyncLLMEngine`` the API uses (a fake implements it in the tests)."""

    is_ready: bool
    model_name: str
    max_model_len: int
    tokenizer: Any

    def generate(
        self, request_id: str, prompt: str | list[int], params: SamplingParams,
        on_scheduled: Callable[[], None] | None = None,
    ) -> AsyncIterator[Any]:
        """Validate at the call (429, 400), then stream the outputs. ``on_scheduled``: called
        once when the request first runs (its energy share starts then, not while it queues)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def abort(self, request_id: str) -> None: ...

    async def wait_dead(self) -> BaseException | None:
        """Return once the engine has died by itself (its failure, or None if it does not say)."""
        ...

    def stats(self) -> dict[str, Any]: ...


@dataclass
class Prepared:
    kind: str  # "chat" or "completion"
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    created: int
    logprobs: bool = False  # the answer reports token log-probabilities
    n: int = 1  # choices: n engine requests sharing the prompt (Choices)
    tools: Any = None  # a ToolPlan: each choice's answer is read for tool calls (tools.py)
    # when the request was taken up (perf_counter), before its tokenization: TTFT and end-to-end
    # latency count from here, the wait a client sees (a long prompt's tokenizing included)
    arrival: float = field(default_factory=time.perf_counter)


class Generation:
    """One admitted engine request: iterate its outputs; ``close`` aborts it if unfinished."""

    counts_prompt = True  # False: a further choice of one request, whose prompt /metrics counted
    # False: an abort counts no finish (a sibling choice was refused: the request is counted once,
    # as rejected)
    counts_abort = True

    def __init__(self, engine: Engine, prepared: Prepared, timer: RequestTimer,
                 energy: Any = None) -> None:
        self.engine = engine
        self.request_id = prepared.request_id
        self.timer = timer
        self._energy = energy  # cloud_server.energy.EnergyAccounting, or None
        self._energy_key: int | None = None
        self._iter: AsyncIterator[Any]
        args = (prepared.request_id, prepared.prompt_ids, prepared.params)
        # its share starts when the engine first schedules it, not while it waits in the queue
        key = self._energy_key = energy.start(queued=True) if energy is not None else None
        on_scheduled = (lambda: energy.started(key)) if key is not None else None
        try:
            self._iter = engine.generate(*args, on_scheduled=on_scheduled)
        except BaseException:  # refused at the call (429, 400): no share
            self._cancel_energy()
            raise
        self._first: Any = None
        self.finished = False
        self.failed = False  # the engine ended it with an error (not the client, not a shutdown)
        self.last: Any = None

    async def admit(self) -> None:
        """Pull the first output; admission errors (queue full, context length) raise here."""
        try:
            self._first = await self._iter.__anext__()
        except StopAsyncIteration:
            self._first = None
        except BaseException as exc:
            # a refusal (queue full, a prompt too long) that comes with the first output, as a
            # cluster replica's does, is counted as rejected only, as the single server's refusal
            # at generate(): not also as a request finished with an error
            self.finished = isinstance(exc, QueueFullError | InvalidRequestError)
            self.failed = isinstance(exc, Exception)
            await self.close()
            raise

    async def outputs(self) -> AsyncIterator[Any]:
        pending = [self._first] if self._first is not None else []
        self._first = None
        while True:
            if pending:
                out = pending.pop()
            else:
                try:
                    out = await self._iter.__anext__()
                except StopAsyncIteration:
                    # ended without its finishing output (a replica cut off): a half answer is
                    # an error, not a 200 with "stop" (close() counts it as failed)
                    self.failed = True
                    raise EngineError("the engine ended the request before it finished") from None
                except Exception:
                    self.failed = True
                    raise
            self.last = out
            self.timer.on_tokens(len(out.delta_token_ids), out.num_prompt_tokens if self.counts_prompt else 0)
            if out.finished:
                self.finished = True
                self.timer.on_finish(out.finish_reason)
                if self._energy is not None:  # sets out.energy (usage.energy)
                    self._energy.finish(self._energy_key, out)
                    self._energy_key = None
                if out.finish_reason not in _ANSWER_ENDS:
                    self.failed = True
                    raise EngineError(f"the engine ended the request ({out.finish_reason})")
            yield out
            if out.finished:
                return

    def _cancel_energy(self) -> None:
        if self._energy is not None and self._energy_key is not None:
            self._energy.cancel(self._energy_key)
            self._energy_key = None

    async def close(self) -> None:
        self._cancel_energy()
        with contextlib.suppress(Exception):
            aclose = getattr(self._iter, "aclose", None)
            if aclose is not None:
                await aclose()
        if not self.finished:
            self.finished = True
            # the engine's own word for a request that failed: /metrics keeps failures apart from
            # the aborts of clients that hung up
            if self.counts_abort:
                self.timer.on_finish("error" if self.failed else "abort")
            with contextlib.suppress(Exception):
                await self.engine.abort(self.request_id)


class _ClosingEvents:
    """Async iterator over ``events`` whose ``aclose`` also closes ``generation``. An async
    generator closed before its first step skips its ``finally``: a client gone before the
    headers went out (EventStreamResponse then closes the events unstarted) left the engine
    request running, its energy share open and no finish recorded."""

    def __init__(self, events: AsyncIterator[str], generation: Generation | Choices) -> None:
        self._events = events
        self._generation = generation

    def __aiter__(self) -> _ClosingEvents:
        return self

    async def __anext__(self) -> str:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        try:
            await self._events.aclose()  # type: ignore[attr-defined]
        finally:
            await self._generation.close()  # a second close does nothing


def choice_prepared(prepared: Prepared, index: int) -> Prepared:
    """Choice ``index`` of an ``n`` > 1 request: its own engine request id and, with a seed, its
    own seed; choice 0 samples as the same request with n=1 would."""
    if prepared.n == 1:
        return prepared
    params = prepared.params
    if params.seed is not None and index:
        # seed_i = (seed + i) mod 2^64     choice i's own stream (vLLM's rule: seed + index), so
        # seed_0 = seed                     the n answers differ and the response is reproducible;
        # the sampler reads seeds mod 2^64: the wrap keeps it in the engine's range, same stream
        params = dataclasses.replace(params, seed=(params.seed + index) % 2**64)
    return dataclasses.replace(prepared, request_id=f"{prepared.request_id}-{index}", params=params)


_DONE = object()  # a choice's pump: its outputs are all in the queue


class Choices:
    """The ``n`` engine requests of one response (``n`` = 1: one ``Generation``, iterated as it is).

    ``admit`` admits choice 0 alone, waits for its first output (its prompt is then prefilled and
    its full blocks in the prefix cache), then the others, which find those blocks: the prompt is
    computed once, bar the tokens of its last partial block per choice. Each choice is checked
    against the queue as a request of its own (at ``generate`` and by the scheduler as it is
    added); a refusal of any is the whole request's (429 or 400), and the others are aborted.
    The response starts once every choice has its first output; meanwhile the admitted choices
    run on (a task per choice pulls its outputs into one queue), so with ``n`` past the batch the
    later choices take the slots the earlier ones free, whether the engine runs its requests by
    itself or only as they are read. ``outputs`` yields (index, output) as the choices produce
    them; an error of one ends it, and ``close`` aborts every unfinished one.
    """

    def __init__(self, generations: list[Generation], queue: asyncio.Queue | None = None,
                 pumps: list[asyncio.Task] | None = None) -> None:
        self.generations = generations
        self._queue = queue
        self._pumps = pumps or []

    @classmethod
    async def admit(cls, engine: Engine, prepared: Prepared, timer: Callable[[], RequestTimer],
                    energy: Any = None) -> Choices:
        generations: list[Generation] = []
        pumps: list[asyncio.Task] = []
        admitted: list[asyncio.Future] = []
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        try:
            first = Generation(engine, choice_prepared(prepared, 0), timer(), energy)
            generations.append(first)
            await first.admit()
            if prepared.n == 1:
                return cls(generations)
            pumps.append(asyncio.create_task(_pump(0, first, queue)))
            loop = asyncio.get_running_loop()
            for i in range(1, prepared.n):
                generation = Generation(engine, choice_prepared(prepared, i), timer(), energy)
                generation.counts_prompt = False  # usage and /metrics count the prompt once
                generations.append(generation)
                admitted.append(loop.create_future())
                pumps.append(asyncio.create_task(_pump(i, generation, queue, admitted[-1])))
            # the first refusal ends the wait (the others may wait for slots a long time)
            done, _ = await asyncio.wait(admitted, return_when=asyncio.FIRST_EXCEPTION)
            for future in done:
                if future.cancelled():
                    raise EngineError("a choice ended before it was admitted")
                if (exc := future.exception()) is not None:
                    raise exc
        except BaseException as exc:
            if isinstance(exc, QueueFullError | InvalidRequestError):
                for generation in generations:  # rejected once (429, 400): no finish per choice
                    generation.counts_abort = False
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for future in admitted:  # each refusal read (asyncio logs an unread one)
                if future.done() and not future.cancelled():
                    future.exception()
            await asyncio.gather(*(g.close() for g in generations), return_exceptions=True)
            raise
        return cls(generations, queue, pumps)

    async def outputs(self) -> AsyncIterator[tuple[int, Any]]:
        if self._queue is None:
            async for out in self.generations[0].outputs():
                yield 0, out
            return
        try:
            remaining = len(self._pumps)
            while remaining:
                index, item = await self._queue.get()
                if item is _DONE:
                    remaining -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield index, item
        finally:
            await self._stop_pumps()

    async def _stop_pumps(self) -> None:
        pumps, self._pumps = self._pumps, []
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)

    @property
    def lasts(self) -> list[Any]:
        """Each choice's last output (None for one that gave none)."""
        return [g.last for g in self.generations]

    async def close(self) -> None:
        """Abort every unfinished choice, at once (one engine step answers all the aborts)."""
        await self._stop_pumps()
        await asyncio.gather(*(g.close() for g in self.generations), return_exceptions=True)


async def _pump(index: int, generation: Generation, queue: asyncio.Queue,
                admitted: asyncio.Future | None = None) -> None:
    """Choice ``index``'s outputs into ``queue``, then ``_DONE`` (or its error); with ``admitted``,
    admit it first and say how that went there (its refusal is the request's, not an output)."""
    try:
        if admitted is not None:
            try:
                await generation.admit()
            except Exception as exc:  # noqa: BLE001 - the admitting request raises it
                admitted.set_exception(exc)
                return
            admitted.set_result(None)
        async for out in generation.outputs():
            queue.put_nowait((index, out))
        # closed at once, not with the response: an engine whose stream holds the request's batch
        # slot until it is closed (one that runs requests only as they are read) frees it for the
        # choices still waiting for one
        await generation.close()
    except Exception as exc:  # noqa: BLE001 - handed to the reader, who ends the request
        queue.put_nowait((index, exc))
    else:
        queue.put_nowait((index, _DONE))
    finally:
        if admitted is not None and not admitted.done():
            admitted.cancel()  # cancelled while admitting: the wait must not hang
