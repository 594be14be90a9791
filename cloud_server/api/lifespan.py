"""The engine's life in the server: the routes' shared state, the background load, the death watch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from cloud_server.exceptions import EngineError, ModelNotFoundError, NotReadyError, ShuttingDownError
from hybridllm.wire.errors import MODEL_LOADING, WireError
from hybridllm.wire.shutdown import SHUTTING_DOWN, Drain

from .serving import Engine, OpenAIServing

logger = logging.getLogger("cloud_server.api")


@dataclass
class ServerState:
    """What the routes share; ``engine`` is ``None`` until it has loaded and started."""

    engine_factory: Callable[[], Engine]
    served_model_name: str | None
    on_load_error: Callable[[BaseException], None] | None
    system_prompt: str | None = None
    on_engine_dead: Callable[[EngineError], None] | None = None
    engine: Engine | None = None
    serving: OpenAIServing | None = None
    load_error: BaseException | None = None
    load_abandoned: bool = False  # shut down before the load ended (its thread runs on)
    drain: Drain = field(default_factory=lambda: Drain(_shutting_down))
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return self.engine.model_name if self.engine is not None else "unknown"

    def ready_serving(self) -> OpenAIServing:
        self.drain.check_open()
        # a failed load and a stopped engine do not come back by themselves (/health: "error"):
        # "retry shortly" had a client retry a server that needs a restart
        if self.load_error is not None:
            raise NotReadyError(f"The model failed to load ({type(self.load_error).__name__}); "
                                "this server cannot serve until it is restarted.")
        if self.serving is None or self.engine is None:
            raise NotReadyError(MODEL_LOADING)
        if not self.engine.is_ready:
            raise NotReadyError("The engine has stopped; this server cannot serve until it is "
                                "restarted.")
        return self.serving

    def check_model(self, requested: str) -> None:
        names = {self.model_name}
        if self.engine is not None:
            names.add(self.engine.model_name)
        if requested not in names:
            raise ModelNotFoundError(
                f"The model '{requested}' does not exist; this server serves '{self.model_name}'."
            )


async def _load_engine(app: FastAPI) -> None:
    state: ServerState = app.state.server
    engine: Engine | None = None
    try:
        # Building the engine loads weights: keep that off the event loop so /health answers.
        engine = await asyncio.to_thread(state.engine_factory)
        await engine.start()
        _attach_energy_meter(app, engine)
        state.engine = engine
        state.serving = OpenAIServing(engine, state.model_name, app.state.metrics,
                                      system_prompt=state.system_prompt)
        where = engine.describe() if hasattr(engine, "describe") else ""
        logger.info("model %s ready (%smax_model_len=%s)", state.model_name,
                    f"{where}; " if where else "", engine.max_model_len)
    except BaseException as exc:
        if engine is not None:
            # built (perhaps half started) but never to serve: its threads, memory and device
            # handles are freed here, the lifespan does not stop it (a shutdown's cancel too)
            state.engine = state.serving = None
            with contextlib.suppress(Exception):
                await engine.stop()
        if not isinstance(exc, Exception):
            raise
        # reported by the CLI as one line, then the server exits
        state.load_error = exc
        logger.error("loading the model failed: %s", exc)
        if state.on_load_error is not None:
            state.on_load_error(exc)
        return
    if state.on_engine_dead is not None:
        await _watch_engine(state, engine, state.on_engine_dead)


async def _watch_engine(state: ServerState, engine: Engine,
                        on_engine_dead: Callable[[EngineError], None]) -> None:
    """Wait for the engine's loop to die while serving (``wait_dead``: woken by the death itself,
    no polling; a shutdown cancels this first); then end every request with a 500 that names its
    error's type and report it (as ``ExceptionType: message``)."""
    cause = await engine.wait_dead()
    if state.drain.is_closing:  # a shutdown came first
        return
    reason = f"{type(cause).__name__}: {cause}" if cause is not None else "its loop ended"
    logger.error("the engine stopped (%s): ending the requests in flight and shutting down, for a "
                 "supervisor to restart the server", reason, exc_info=cause)
    # the type only to the clients: an exception's text may quote a request (it is in the log)
    kind = type(cause).__name__ if cause is not None else "its loop ended"
    error = WireError(f"The engine failed ({kind}) and the server is shutting down; retry the request "
                      "on another server, or on this one once it has restarted.",
                      status=500, type="server_error", code="engine_dead")
    state.drain.error = lambda: error
    await state.drain.run(0.0)  # refuse new requests; those in flight end now: none can finish
    with contextlib.suppress(Exception):
        await engine.stop()  # what still waits on the engine (an abort, a stream) is released
    on_engine_dead(EngineError(reason))


def _attach_energy_meter(app: FastAPI, engine: Any) -> None:
    """Measure energy here (``energy="auto"``): NVML, RAPL or an estimate, on the engine's device."""
    accounting = app.state.metrics.energy
    if accounting is None or app.state.energy_mode != "auto":
        return
    from cloud_server.energy import meter_for

    inner = getattr(engine, "engine", None)
    config = getattr(engine, "config", None)
    accounting.meter = meter_for(str(getattr(inner, "device", "cpu")), power_watts=app.state.power_watts,
                                 num_threads=getattr(config, "num_threads", None))
    logger.info("energy per request from %s", accounting.meter.name)


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    task = asyncio.create_task(_load_engine(app))
    try:
        yield
    finally:
        # still loading (the task goes on watching the engine once it serves)
        app.state.server.load_abandoned = not task.done() and app.state.server.serving is None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        engine = app.state.server.engine
        if engine is not None:
            with contextlib.suppress(Exception):
                await engine.stop()
        if app.state.metrics.energy is not None:
            app.state.metrics.energy.close()  # NVML's session; nothing to release for the others



def _shutting_down() -> ShuttingDownError:
    return ShuttingDownError(SHUTTING_DOWN)

