"""The front end's engine: the ``Engine`` protocol of ``cloud_server.api`` over a Ray Serve handle.

The front end keeps the whole OpenAI layer of the single-process server (parsing, chat templates,
tokenization, context checks, SSE, errors, metrics): only ``generate`` goes to a replica, chosen by
the deployment's request router from the prompt's token ids. Faults:

- a replica that dies (or is unreachable, or whose engine loop died: ``EngineDeadError``,
  ``NotReadyError``) before the request's first output: the request is sent again, up to
  ``retries`` times (the router skips the dead replica once Serve reports it);
- one that dies after the first output: the request ends with ``EngineError`` (HTTP 500, or an
  error event in a stream), never a hang: Ray fails the stream when the actor dies;
- an error the replica raised on purpose (queue full, context length) comes back as itself;
- any other exception of the replica's code (a bug: Ray's ``RayTaskError``) ends the request with
  ``EngineError`` at once: another replica runs the same code, so it is not sent again.

Fleet state for ``/metrics`` and ``/health`` comes from :class:`~.fleet.FleetBoard`, where every
replica posts its engine stats once a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..exceptions import EngineDeadError, EngineError, NotReadyError, ServerError
from .autoscale import TARGET_NOTE
from .fleet import FleetCounters, board_lost

log = logging.getLogger("cloud_server.cluster")


# what a replica whose engine loop died (or stopped) raises: the request may go to another one
_REPLICA_GONE = (EngineDeadError, NotReadyError)
# the fleet's gauges of work in hand: with no replica reporting (scaled to zero, all down) they
# read 0 in /metrics rather than vanish (a missing series reads as "no data", and alerts on it
# or graphs of it break exactly when the fleet is down)
_FLEET_GAUGES = ("num_running", "num_waiting", "kv_cache_usage", "num_total_blocks",
                 "num_free_blocks", "num_cached_blocks")


def _code_error(exc: BaseException) -> bool:
    """The replica's own code raised (Ray's RayTaskError: a bug there, say), as opposed to the
    replica's process, node or engine going away: another replica would fail the same way, so it
    is not sent again. A task error whose cause is an actor's death is still a death."""
    from ray.exceptions import RayActorError, RayTaskError

    return isinstance(exc, RayTaskError) and not isinstance(getattr(exc, "cause", None), RayActorError)


def _replica_error(exc: BaseException) -> ServerError | None:
    """The ServerError a replica raised on purpose, unwrapped from Ray's RayTaskError."""
    if isinstance(exc, ServerError):
        cause = getattr(exc, "cause", None)
        return cause if isinstance(cause, ServerError) else exc
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, ServerError) else None


class RemoteEngine:
    def __init__(
        self,
        handle: Any,
        model: str,
        *,
        board: Any = None,
        target_replicas: int = 1,
        retries: int = 2,
        stale_after_s: float = 3.0,
        renew_board: Any = None,
    ) -> None:
        self._handle = handle
        self._model = model
        self._board = board
        self._renew_board = renew_board  # () -> the board's handle, got or created again
        self.target_replicas = target_replicas
        self.retries = retries
        self.stale_after_s = stale_after_s
        self.tokenizer: Any = None
        self.model_name = model
        self.max_model_len = 0
        self._ready = False
        self._fleet: dict[str, dict[str, Any]] = {}
        self._fleet_at: float | None = None  # when the board last answered (monotonic)
        self._counters = FleetCounters()  # the counters of replicas gone from the fleet
        self._serve_target: int | None = None  # autoscaled: Serve's target, noted by the policy
        self._poller: asyncio.Task | None = None
        self.num_retried = 0
        self.num_replica_failures = 0

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        from ..models.loader import resolve_model_path

        info = await self._handle.describe.remote()
        self.model_name, self.max_model_len = info["model_name"], int(info["max_model_len"])
        _, path = resolve_model_path(self._model)
        self.tokenizer = await asyncio.to_thread(_load_tokenizer, path)
        self._ready = True
        if self._board is not None:
            await self._poll_once()
            self._poller = asyncio.create_task(self._poll(), name="hybridllm-fleet-poll")

    async def stop(self) -> None:
        self._ready = False
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._poller

    @property
    def is_ready(self) -> bool:
        return self._ready

    async def wait_dead(self) -> BaseException | None:
        """Never returns: the front end has no engine loop of its own to die. A replica that dies
        fails its requests (retried, or an ``EngineError``) and Serve replaces it."""
        await asyncio.get_running_loop().create_future()  # never set; cancelled with its waiter
        return None

    async def _poll_once(self) -> None:
        try:
            # a board that does not answer (its actor hung or its node gone) must not stall the poll
            wait = self.stale_after_s
            fleet = await asyncio.wait_for(self._board.snapshot.remote(self.stale_after_s), wait)
            notes = await asyncio.wait_for(self._board.notes.remote(), wait)
            self._fleet, self._fleet_at = fleet, time.monotonic()
            if TARGET_NOTE in notes:  # a board created again lacks it until the policy notes it
                target = notes[TARGET_NOTE]
                self._serve_target = int(target) if isinstance(target, int) and target >= 0 else None
        except Exception as exc:  # noqa: BLE001 - stats are best effort
            log.debug("fleet board unreachable: %s", exc)
            if board_lost(exc) and self._renew_board is not None:
                # its actor died (killed, its node lost): got or created again by name, the
                # replicas' next posts refill it; else /health would say 503 for good
                try:
                    self._board = await asyncio.to_thread(self._renew_board)
                except Exception as renew_exc:  # noqa: BLE001 - tried again on the next poll
                    log.debug("fleet board not created again: %s", renew_exc)
            # its last answer is all we know: once older than stale_after_s, no replica is known
            # to be up (the board's own rule), not the fleet as it was then for ever
            if self._fleet_at is None or time.monotonic() - self._fleet_at > self.stale_after_s:
                self._fleet = {}
        self._counters.update(self._fleet)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            await self._poll_once()

    # -- fleet state ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Every replica's engine stats, summed (gauges of the last step: the largest); the counters
        keep the shares of replicas that left, so a fleet total never goes down. Plus the front
        end's own figures: replicas reporting and wanted, requests sent again, failed attempts."""
        out = self._counters.stats(self._fleet)
        for key in _FLEET_GAUGES:
            out.setdefault(key, 0)
        out["num_replicas"] = len(self._fleet)
        out["num_replicas_wanted"] = self._wanted()
        out["num_retried"] = self.num_retried
        out["num_replica_failures"] = self.num_replica_failures
        return out

    def _wanted(self) -> int:
        """Serve's current target when autoscaled (noted by the policy), else the fixed count."""
        return self._serve_target if self._serve_target is not None else self.target_replicas

    def health_detail(self) -> dict[str, Any]:
        """ok: every wanted replica reports; degraded: some do (still serving); idle: scaled to
        zero (``--min-replicas 0``), so the next request waits for a replica to load its model;
        unavailable: none reports while some are wanted (the only one that is not HTTP 200).
        Wanted: Serve's current target when autoscaled (noted by the policy), else the fixed count."""
        up, wanted = len(self._fleet), self._wanted()
        if up == 0:
            status = "idle" if wanted == 0 else "unavailable"
        else:
            status = "ok" if up >= wanted else "degraded"
        return {"status": status, "replicas": {"healthy": up, "wanted": wanted}}

    # -- requests ------------------------------------------------------------------------------
    def generate(self, request_id: str, prompt: str | list[int], params: Any,
                 on_scheduled: Callable[[], None] | None = None) -> AsyncIterator[Any]:
        """``on_scheduled`` is called at the replica's first output: the replica has scheduled
        the request by then (it measures its own energy from its own first step)."""
        if not self._ready:
            raise NotReadyError("the cluster front end is still starting")
        ids = list(self.tokenizer.encode(prompt)) if isinstance(prompt, str) else list(prompt)
        fields = dataclasses.asdict(dataclasses.replace(params, response_format=None))
        # a Grammar travels as its normalized OpenAI dict, which the replica's SamplingParams parses
        grammar = params.response_format
        fields["response_format"] = grammar.response_format if grammar is not None else None
        return self._stream(request_id, ids, fields, on_scheduled)

    async def _stream(
        self, request_id: str, prompt_ids: list[int], params: dict[str, Any],
        on_scheduled: Callable[[], None] | None = None,
    ) -> AsyncIterator[Any]:
        from ray.exceptions import RayError
        from ray.serve.exceptions import DeploymentUnavailableError

        attempt = 0
        while True:
            rid = request_id if attempt == 0 else f"{request_id}-retry{attempt}"
            stream = self._handle.options(stream=True).generate.remote(prompt_ids, params, rid)
            got_output = False
            try:
                async for out in stream:
                    if not got_output and on_scheduled is not None:
                        on_scheduled()  # once: no retry follows a first output
                    got_output = True
                    yield out
                return
            except DeploymentUnavailableError as exc:
                # Serve's own refusal, before any replica: the engine deployment failed to deploy
                # (its replicas crash at start). A 503 that says so, not an anonymous 500
                raise NotReadyError("no engine replica is available: the engine deployment failed "
                                    "to start (see the Serve logs)") from exc
            except (ServerError, RayError) as exc:
                own = _replica_error(exc)
                # a replica whose engine is gone says so on purpose: a fault of the replica, not
                # of the request, sent again (before its first output) like a dead replica's
                if own is not None and (got_output or not isinstance(own, _REPLICA_GONE)):
                    raise own from None
                self.num_replica_failures += 1
                if got_output or attempt >= self.retries:
                    raise EngineError(
                        "the replica serving this request failed"
                        + (" mid-answer" if got_output else f" ({attempt + 1} attempts)")
                    ) from exc
                if own is None and _code_error(exc):  # a bug there, not a death: no second try
                    log.error("request %s: the replica raised %s", request_id, exc)
                    cause = type(getattr(exc, "cause", None) or exc).__name__
                    raise EngineError(f"the replica serving this request failed ({cause})") from exc
                attempt += 1
                self.num_retried += 1
                log.warning(
                    "request %s: replica failed before answering (%s); retrying",
                    request_id,
                    type(exc).__name__,
                )
                await asyncio.sleep(0.2 * attempt)
            finally:
                with contextlib.suppress(Exception):
                    stream.cancel()  # a no-op when the stream finished; else aborts the request

    async def abort(self, request_id: str) -> None:
        """Closing the stream cancels the replica's call, which aborts the request there."""


def _load_tokenizer(path: Any) -> Any:
    """The model's tokenizer alone (the same the replicas load with the weights)."""
    from ..models.tokenizer import GGUFTokenizer, HFTokenizer

    return HFTokenizer(path) if path.is_dir() else GGUFTokenizer(path)
