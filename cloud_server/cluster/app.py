"""The Ray Serve application: N engine replicas behind one OpenAI-compatible front end.

    client --HTTP--> Serve proxy --> front end (1 replica: the FastAPI app of cloud_server.api,
                                     chat template, tokenization, checks, SSE, /metrics, /health)
                                        | handle.generate(prompt_ids, params, request_id)
                                        | routed by TokenPrefixRequestRouter (router.py)
                                        v
                                     engine replica 1..N (AsyncLLMEngine, one model each)

Each engine replica reports its load (``record_routing_stats``: outstanding tokens, prefix block
hashes) to the router, its queued tokens to the autoscaler (``record_autoscaling_stats``), and its
engine stats to the fleet board once a second; it measures the energy of its own requests and
hands it back on each request's last output. Importing this module imports Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from typing import Any

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from ..config import ClusterConfig, EngineConfig
from ..exceptions import ConfigError
from .autoscale import METRIC, QueuedTokensPolicy
from .builder_args import typed_args
from .fleet import FleetBoard, board_lost
from .router import TokenPrefixRequestRouter

log = logging.getLogger("cloud_server.cluster")
APP_NAME = "hybridllm"
ENGINE = "hybridllm-engine"
FRONTEND = "hybridllm-frontend"
NAMESPACE = "hybridllm"


def board_handle(name: str) -> Any:
    """The fleet board actor, created by whoever asks first: in practice the front end, whose
    ``__init__`` asks before any engine replica has loaded its model. Not detached: Ray kills an
    actor with the worker that created it, so the board goes with the app (deleted, or replaced
    by a redeploy, which names a board of its own) and never outlives it. A detached one was left
    on the cluster by every KubeRay redeploy (nothing there kills it) and by a stop whose app
    deletion failed. A board that goes with its creator while the app runs (an engine replica
    that created it scaled away) is created again by the next to ask (``board_lost``)."""
    return (
        ray.remote(num_cpus=0)(FleetBoard)
        .options(name=name, namespace=NAMESPACE, get_if_exists=True)
        .remote()
    )


class EngineReplica:
    """One engine replica (a Serve deployment class)."""

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits an async __init__
        self, engine_kwargs: dict[str, Any], board_name: str, power_watts: float | None = None
    ) -> None:
        from ..energy import meter_for
        from ..engine.async_engine import AsyncLLMEngine

        config = EngineConfig(**engine_kwargs)
        self.engine = AsyncLLMEngine(config)
        await self.engine.start()  # loads the weights in a worker thread
        device = str(self.engine.engine.device)
        self.meter = meter_for(device, power_watts=power_watts, num_threads=config.num_threads)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self._board_name = board_name
        self._board = board_handle(board_name)
        self._reports = 0
        self._last_report: dict[str, Any] | None = None
        self._poster = asyncio.get_running_loop().create_task(self._post_stats())

    async def _post_stats(self) -> None:
        while True:
            # a replica whose engine loop died posts nothing: /health must not count it as up
            # while Serve's health check (every 2 s, then its restart) catches up with it
            try:
                if self.engine.is_ready:
                    # awaited (at most a few seconds): a board whose actor died says so here
                    await asyncio.wait_for(self._board.post.remote(
                        self.replica,
                        {"stats": self.engine.stats(), "pid": os.getpid(), "energy_source": self.meter.name},
                    ), 5.0)
            except Exception as exc:  # noqa: BLE001 - stats are best effort
                if board_lost(exc):  # got again, or created again: the replicas' posts refill it
                    with contextlib.suppress(Exception):
                        self._board = await asyncio.to_thread(board_handle, self._board_name)
            await asyncio.sleep(1.0)

    def _load_report(self) -> dict[str, Any]:
        for _ in range(5):  # the engine thread may change a list while it is read: read again
            try:
                report = self.engine.engine.load_report()
                break
            except RuntimeError:
                continue
        else:
            # the last report that read, stamp and all (the router keeps its books); a zero report
            # would show a busy replica idle, its cache empty, to the router and the autoscaler
            if self._last_report is not None:
                return dict(self._last_report)
            report = {"outstanding_tokens": 0, "prefix_hashes": []}
        self._reports += 1
        report["reported_at"] = (self.replica, self._reports)
        self._last_report = report
        return dict(report)

    # -- what Serve calls ----------------------------------------------------------------------
    def record_routing_stats(self) -> dict[str, Any]:
        return self._load_report()

    def record_autoscaling_stats(self) -> dict[str, float]:
        return {METRIC: float(self._load_report()["outstanding_tokens"])}

    def check_health(self) -> None:
        if not self.engine.is_ready:
            raise RuntimeError("the engine loop stopped")

    def describe(self) -> dict[str, Any]:
        return {
            "model_name": self.engine.model_name,
            "max_model_len": self.engine.max_model_len,
            "replica": self.replica,
            "pid": os.getpid(),
            "energy_source": self.meter.name,
        }

    async def generate(self, prompt_ids: list[int], params: dict[str, Any], request_id: str):
        from ..energy import energy_report
        from ..engine.sampling_params import SamplingParams

        # its share of the replica's energy starts at its first engine step, not while it waits
        key = self.meter.begin(queued=True)
        done = False
        try:
            async for out in self.engine.generate(request_id, prompt_ids, SamplingParams(**params),
                                                  on_scheduled=lambda: self.meter.started(key)):
                if out.finished:
                    out.energy = energy_report(self.meter.end(key), out.num_output_tokens, self.meter.name)
                    done = True
                yield out
        finally:
            if not done:
                self.meter.end(key)


class FrontendIngress:
    """The OpenAI front end (a Serve ingress deployment; its ASGI app is built on the replica)."""

    def __init__(
        self, engine: Any, model: str, board_name: str, target_replicas: int, app_options: dict[str, Any]
    ) -> None:
        self._engine_handle = engine
        self._model = model
        self._board_name = board_name
        self._board = board_handle(board_name)
        self._target = target_replicas
        self._options = app_options

    def __serve_build_asgi_app__(self) -> Any:
        from ..api.server import create_app
        from .remote_engine import RemoteEngine

        def make_engine() -> RemoteEngine:
            return RemoteEngine(
                self._engine_handle, self._model, board=self._board, target_replicas=self._target,
                renew_board=lambda: board_handle(self._board_name),  # once its actor died
            )

        return create_app(make_engine, energy="remote", **self._options)  # type: ignore[arg-type]


def replica_num_gpus(engine_config: EngineConfig) -> int:
    """GPUs each engine replica asks Ray for: one with ``device="cuda"`` (Ray then makes only
    that GPU visible to it, and places replicas by free GPUs), none on CPU or the default device."""
    device = engine_config.device or ""
    if device.startswith("cuda:"):
        raise ConfigError(
            f"--device {device} names one GPU; with --replicas use --device cuda (Ray gives each "
            "replica a GPU of its own)"
        )
    return 1 if device == "cuda" else 0


def autoscaling_config(cluster: ClusterConfig, board_name: str | None = None) -> dict[str, Any]:
    """Serve's ``autoscaling_config`` for an autoscaled ``cluster``: our queued-tokens policy,
    which notes Serve's target on the fleet board ``board_name`` for ``/health``."""
    return {
        "min_replicas": cluster.min_replicas,
        "max_replicas": cluster.max_replicas,
        "initial_replicas": cluster.replicas,
        "upscale_delay_s": cluster.upscale_delay_s,
        "downscale_delay_s": cluster.downscale_delay_s,
        "look_back_period_s": cluster.autoscale_window_s,
        "policy": {
            "policy_function": QueuedTokensPolicy,
            "policy_kwargs": {
                "target_tokens_per_replica": cluster.target_tokens_per_replica,
                "board_name": board_name,
            },
        },
    }


def build_app(
    engine_config: EngineConfig,
    cluster: ClusterConfig,
    *,
    router: str = "tokens",
    app_options: dict[str, Any] | None = None,
    power_watts: float | None = None,
    board_name: str | None = None,
) -> Any:
    """The Serve application. ``router``: "tokens" (ours) or "default" (Serve's power of two
    choices, for comparison; the replicas report the same stats either way)."""
    if router not in ("tokens", "default"):
        raise ValueError(f"router must be 'tokens' or 'default', got {router!r}")
    engine_kwargs = dataclasses.asdict(engine_config)
    if engine_kwargs.get("num_threads") is None:  # one torch thread per CPU the replica holds
        engine_kwargs["num_threads"] = max(1, int(cluster.replica_cpus))
    board = board_name or f"hybridllm-fleet-{os.getpid()}-{time.monotonic_ns()}"
    router_config: dict[str, Any] = {
        "request_routing_stats_period_s": cluster.stats_period_s,
        "request_routing_stats_timeout_s": max(5.0, 4 * cluster.stats_period_s),
    }
    if router == "tokens":
        router_config["request_router_class"] = TokenPrefixRequestRouter
        router_config["request_router_kwargs"] = {
            "block_size": engine_config.block_size,
            # replicas that cache no prefix (--no-prefix-caching): no affinity, balance by load
            "prefix_caching": engine_config.enable_prefix_caching,
            "imbalance_ratio": cluster.imbalance_ratio,
            "min_margin_tokens": cluster.min_margin_tokens,
            # a report older than two of Serve's stats timeouts is from a replica that stopped
            "report_ttl_s": max(10.0, 2 * router_config["request_routing_stats_timeout_s"]),
            "board_name": board,
        }
    actor_options: dict[str, Any] = {"num_cpus": cluster.replica_cpus}
    if num_gpus := replica_num_gpus(engine_config):
        actor_options["num_gpus"] = num_gpus
    options: dict[str, Any] = {
        "name": ENGINE,
        "ray_actor_options": actor_options,
        "max_ongoing_requests": cluster.max_ongoing_requests,
        "health_check_period_s": 2.0,
        "health_check_timeout_s": 30.0,
        # a replica the autoscaler removes, or the app's deletion at exit, gets this long to finish
        # its answers, then is killed
        "graceful_shutdown_timeout_s": cluster.graceful_shutdown_s,
        "request_router_config": RequestRouterConfig(**router_config),
    }
    if cluster.autoscaling:
        options["autoscaling_config"] = autoscaling_config(cluster, board)
    else:
        options["num_replicas"] = cluster.replicas
    engine = serve.deployment(EngineReplica).options(**options)  # type: ignore[attr-defined]
    frontend = serve.deployment(serve.ingress()(FrontendIngress)).options(  # type: ignore[attr-defined]
        name=FRONTEND,
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=4096,
        # it streams the engine replicas' answers: at exit it waits as long as they do
        graceful_shutdown_timeout_s=cluster.graceful_shutdown_s,
    )
    return frontend.bind(
        engine.bind(engine_kwargs, board, power_watts),
        engine_config.model,
        board,
        cluster.replicas,  # Serve's first target (autoscaled: until the policy notes its own)
        dict(app_options or {}),
    )


def app_builder(args: dict[str, Any]) -> Any:
    """A Serve config file's ``import_path: cloud_server.cluster.app:app_builder`` (KubeRay's
    RayService): ``args`` hold ``model`` and any EngineConfig or ClusterConfig field, plus
    ``served_model_name``, ``system_prompt``, ``api_keys``, ``max_body_bytes``, ``power_watts``;
    strings (``serve run``'s ``key=value``) are typed as the fields say (``builder_args``)."""
    engine_fields = {f.name for f in dataclasses.fields(EngineConfig)}
    cluster_fields = {f.name for f in dataclasses.fields(ClusterConfig)}
    app_fields = {"served_model_name", "system_prompt", "api_keys", "max_body_bytes"}
    unknown = set(args) - engine_fields - cluster_fields - app_fields - {"power_watts"}
    if unknown:
        raise ValueError(f"unknown app_builder args {sorted(unknown)}")
    args = typed_args(args)  # `serve run ...:app_builder replicas=2` passes strings
    engine = EngineConfig(**{k: v for k, v in args.items() if k in engine_fields})
    cluster = ClusterConfig(**{k: v for k, v in args.items() if k in cluster_fields})
    options = {k: v for k, v in args.items() if k in app_fields}
    return build_app(engine, cluster, app_options=options, power_watts=args.get("power_watts"))
