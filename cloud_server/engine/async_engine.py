"""The asyncio face of the engine, for the HTTP server.

One background task owns the ``LLMEngine``: it applies queued adds and aborts, runs ``step`` in
its one worker thread (the event loop stays free while the model computes), and routes each output to
its request's queue (an error that belongs to one request goes to that request alone; a failed
forward pass fails its batch, and requests that only waited stay for the next step). ``generate``
validates at once (so the server can answer 400/429 before it starts a stream), then yields
outputs as they come; leaving the loop early (``aclose``, a cancelled task, a dropped client)
aborts the request and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..config import EngineConfig
from ..exceptions import EngineDeadError, EngineError, InvalidRequestError, NotReadyError, QueueFullError
from .outputs import RequestOutput
from .sampling_params import SamplingParams

logger = logging.getLogger(__name__)

MAX_FAILED_STEPS = 3  # steps failing in a row, none working between them, that end the engine


class AsyncLLMEngine:
    def __init__(self, config: EngineConfig, *, engine: Any = None) -> None:
        """``engine``: an already loaded ``LLMEngine`` to drive (tests); else start() loads one."""
        self.config = config
        self.engine: Any = engine  # LLMEngine, built by start() unless given
        self._ops: deque[tuple[str, Any, asyncio.Future | None]] = deque()
        # the futures of ops the engine thread took off ``_ops`` in the step now in hand: a loop
        # that dies before it answers them still releases their callers
        self._taken: list[asyncio.Future] = []
        self._queues: dict[str, asyncio.Queue] = {}
        self._wakeup: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._stopping = False
        self.failure: BaseException | None = None  # what ended the loop while serving, if anything
        self._dead: asyncio.Event | None = None  # set when the loop ends with ``failure``: wait_dead()
        # Every load and step runs on this one thread. torch's CPU kernels keep a team of worker
        # threads per calling thread, spinning a while after each op; steps that hop between the
        # threads of asyncio's shared pool (which grows when requests prepare concurrently) leave
        # an idle team spinning on the cores the live one needs: single-stream decode went from
        # 19 to 27 ms a token after two concurrent requests (SmolLM2, 2 threads).
        self._executor: ThreadPoolExecutor | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        from .llm_engine import LLMEngine

        if self._loop_task is not None:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hybridllm-engine")
        if self.engine is None:
            self.engine = await self._in_engine_thread(LLMEngine, self.config)
        self._stopping = False
        self.failure = None
        self._wakeup = asyncio.Event()
        self._dead = asyncio.Event()  # made on the loop that runs the engine
        self._loop_task = asyncio.create_task(self._run(), name="hybridllm-engine-loop")

    async def stop(self) -> None:
        self._stopping = True
        if self._wakeup is not None:
            self._wakeup.set()
        if self._loop_task is not None:
            task, self._loop_task = self._loop_task, None
            await task  # the loop keeps its own failure (``failure``), it does not raise it
        # ops the loop did not get to: an abort's caller is told it is done (the engine is
        # gone, and its blocks with it) rather than left waiting for ever
        while self._ops:
            _, _, fut = self._ops.popleft()
            if fut is not None and not fut.done():
                fut.set_result(None)
        for rid, queue in list(self._queues.items()):
            queue.put_nowait(EngineError("the engine stopped"))
            self._queues.pop(rid, None)
        if self._executor is not None:
            executor, self._executor = self._executor, None
            executor.shutdown(wait=False)

    async def _in_engine_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def wait_dead(self) -> BaseException | None:
        """Return once the loop has ended with a failure, with that failure (``failure``): the
        engine is dead and does not come back. Never returns while it serves, nor after ``stop``
        (a shutdown is no death); the server's watcher awaits this rather than polling."""
        if self._dead is None:
            raise NotReadyError("the engine has not started")
        await self._dead.wait()
        return self.failure

    @property
    def is_ready(self) -> bool:
        task = self._loop_task
        return self.engine is not None and task is not None and not task.done()

    def _require_engine(self) -> Any:
        if self.engine is None:
            raise NotReadyError("the model is still loading")
        return self.engine

    @property
    def model_name(self) -> str:
        return self._require_engine().model_name

    @property
    def max_model_len(self) -> int:
        return self._require_engine().max_model_len

    @property
    def tokenizer(self) -> Any:
        return self._require_engine().tokenizer

    def describe(self) -> str:
        return self._require_engine().describe()

    def stats(self) -> dict:
        if self.engine is None:
            return {}
        return self.engine.stats()

    # -- requests ----------------------------------------------------------------------------
    def generate(
        self, request_id: str, prompt: str | list[int], params: SamplingParams,
        on_scheduled: Callable[[], None] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Validate now (ContextLengthError, QueueFullError, ...), then stream the outputs.
        ``on_scheduled``: ``LLMEngine.add_request``'s, called in the engine thread."""
        engine = self._require_engine()
        if not self.is_ready:
            raise NotReadyError("the engine loop is not running")
        if request_id in self._queues:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")
        prompt_ids = engine.encode_prompt(prompt)
        engine.check_request(prompt_ids, params)
        # a copy first (one C call, atomic): the engine thread pops from the deque meanwhile, and
        # iterating it in Python raised "deque mutated during iteration"
        pending = sum(1 for op in list(self._ops) if op[0] == "add")
        # Count only what waits beyond the free batch slots: a burst fills the batch first.
        if engine.scheduler.num_queued_beyond_slots + pending - self._free_slots_left(engine) >= \
                self.config.max_waiting:
            raise QueueFullError(f"the waiting queue is full ({self.config.max_waiting} requests)")
        return self._stream(request_id, prompt_ids, params, on_scheduled)

    @staticmethod
    def _free_slots_left(engine: Any) -> int:
        """Batch slots that neither a running nor an already waiting request will take."""
        sched = engine.scheduler
        return max(0, sched.max_num_seqs - len(sched.running) - len(sched.waiting))

    async def _stream(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams,
        on_scheduled: Callable[[], None] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        prepare = getattr(self.engine, "prepare_structured", None)
        if params.response_format is not None and prepare is not None:
            # the first such request builds the vocabulary's index (seconds for a large one), and
            # a new pattern its token groups, here, off the engine thread: the requests already
            # running go on stepping meanwhile
            await asyncio.to_thread(prepare, params.response_format)
        if not self.is_ready:  # read after the loop ended: no loop would ever answer it
            raise self._ended_error()
        # generate() checked, but two streams of one id may both be made before either is read:
        # the second must not take the first's queue (the first then waited for ever)
        if request_id in self._queues:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = queue
        hook = (on_scheduled,) if on_scheduled is not None else ()  # an engine without hooks: as before
        self._push("add", (request_id, prompt_ids, params, *hook))
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self._push("abort", request_id)

    def _ended_error(self) -> EngineError:
        if self.failure is not None:
            return EngineDeadError(f"The engine failed ({type(self.failure).__name__}); retry the "
                                   "request on another server, or on this one once it has restarted.")
        return EngineError("the engine stopped")

    async def abort(self, request_id: str) -> None:
        """Abort a request; returns once its KV blocks are back in the pool."""
        if self._loop_task is None or self._loop_task.done():  # no loop to free them: nothing holds them
            return
        fut = asyncio.get_running_loop().create_future()
        self._push("abort", request_id, fut)
        await fut

    def _push(self, op: str, arg: Any, fut: asyncio.Future | None = None) -> None:
        self._ops.append((op, arg, fut))
        if self._wakeup is not None:
            self._wakeup.set()

    # -- background loop ---------------------------------------------------------------------
    def _apply_ops(self) -> list[tuple[asyncio.Future | None, Any]]:
        """Runs in the worker thread, between steps: the only place the engine is mutated."""
        done: list[tuple[asyncio.Future | None, Any]] = []
        while self._ops:
            op, arg, fut = self._ops.popleft()
            if fut is not None:
                self._taken.append(fut)
            try:
                if op == "add":
                    self.engine.add_request(*arg)
                    result: Any = None
                else:
                    result = self.engine.abort(arg)
            except Exception as exc:  # routed to the request's own stream
                result = exc
                if op == "add":
                    result = (arg[0], exc)
            done.append((fut, (op, result)))
        return done

    def _step_once(self) -> tuple[list, list[RequestOutput], Exception | None, bool]:
        """The ops, then one step if there is work: (ops done, outputs, the step's error, stepped)."""
        done = self._apply_ops()
        if not self.engine.has_unfinished():
            return done, [], None, False
        try:
            outputs = self.engine.step()
        except Exception as exc:  # the ops were applied all the same: their callers still wait
            return done, [], exc, True
        return done, outputs, None, True

    async def _run(self) -> None:
        try:
            await self._serve()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - a bug in the loop: nothing waits for ever on it
            # A step's own failure is caught per step (its batch gets the error, the loop goes on);
            # what lands here broke the loop itself. It is kept in ``failure`` (the server exits on
            # it), every stream ends with an error that names it, and every waiting op is released.
            self.failure = exc
            logger.error("the engine loop failed", exc_info=exc)
            # the type only: an exception's text may quote a request (it is in the log)
            error = self._ended_error()
            for rid, queue in list(self._queues.items()):
                queue.put_nowait(error)
                self._queues.pop(rid, None)
            futures: list[asyncio.Future | None] = list(self._taken)
            self._taken = []
            while self._ops:
                futures.append(self._ops.popleft()[2])
            for fut in futures:
                if fut is not None and not fut.done():
                    fut.set_result(None)
            if self._dead is not None:  # last: what waits on it finds everything above released
                self._dead.set()

    async def _serve(self) -> None:
        wakeup = self._wakeup
        if wakeup is None:  # start() always sets it
            return
        failed_in_a_row = 0
        while not self._stopping:
            if not self._ops and not self.engine.has_unfinished():
                wakeup.clear()
                await wakeup.wait()
                continue
            self._taken = []
            try:
                done, outputs, failure, stepped = await self._in_engine_thread(self._step_once)
            except Exception as exc:  # the ops it took are answered all the same
                done = [(fut, ("abort", None)) for fut in self._taken]
                outputs, failure, stepped = [], exc, True
            if failure is not None:
                logger.error("engine step failed", exc_info=failure)
                self._fail_all(failure if isinstance(failure, EngineError) else EngineError(str(failure)))
                # One failed step fails its batch and the engine goes on (one bad request, a
                # passing out-of-memory); MAX_FAILED_STEPS in a row, no step working between them,
                # is an engine that cannot step (a lost GPU): it is dead, and the server exits.
                failed_in_a_row += 1
            elif stepped:
                failed_in_a_row = 0
            for fut, (op, result) in done:
                if op == "add" and isinstance(result, tuple):
                    rid, error = result
                    if rid in self._queues:
                        self._queues[rid].put_nowait(error)
                else:
                    if isinstance(result, RequestOutput) and result.request_id in self._queues:
                        self._queues[result.request_id].put_nowait(result)  # ends its stream
                    if fut is not None and not fut.done():
                        fut.set_result(None)
            for out in outputs:
                queue = self._queues.get(out.request_id)
                if queue is not None:  # a request that failed alone ends with its own error
                    queue.put_nowait(EngineError(out.error) if out.error is not None else out)
            if failure is not None and failed_in_a_row >= MAX_FAILED_STEPS:
                raise failure  # after the ops' callers above were answered

    def _fail_all(self, exc: EngineError) -> None:
        """Fail the step's batch (every stream when the error does not name it): a request that
        only waited was not in the failed step, and the engine keeps it for the next one."""
        rids = list(self._queues) if exc.request_ids is None else exc.request_ids
        for rid in rids:
            queue = self._queues.get(rid)
            if queue is not None:
                queue.put_nowait(exc)
                self._ops.append(("abort", rid, None))
