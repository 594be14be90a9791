"""One admitted engine request: the ``Engine`` it runs on, its ``Prepared`` input, its ``Generation``."""

from __future__ import annotations

import contextlib
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
    # when the request was taken up (perf_counter), before its tokenization: TTFT and end-to-end
    # latency count from here, the wait a client sees (a long prompt's tokenizing included)
    arrival: float = field(default_factory=time.perf_counter)


class Generation:
    """One admitted engine request: iterate its outputs; ``close`` aborts it if unfinished."""

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
            self.timer.on_tokens(len(out.delta_token_ids), out.num_prompt_tokens)
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
            self.timer.on_finish("error" if self.failed else "abort")
            with contextlib.suppress(Exception):
                await self.engine.abort(self.request_id)


class _ClosingEvents:
    """Async iterator over ``events`` whose ``aclose`` also closes ``generation``. An async
    generator closed before its first step skips its ``finally``: a client gone before the
    headers went out (EventStreamResponse then closes the events unstarted) left the engine
    request running, its energy share open and no finish recorded."""

    def __init__(self, events: AsyncIterator[str], generation: Generation) -> None:
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
