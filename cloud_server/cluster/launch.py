"""``hybridllm-cloud serve --replicas N``: start (or join) Ray, run the app, wait, clean up.

Without ``--ray-address`` a local Ray instance is started and shut down on exit; with one, the app
is deployed on that cluster and deleted on exit (the cluster keeps running).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from hybridllm._cli_options import host_port

from ..config import ClusterConfig, EngineConfig
from ..exceptions import ServerError
from ._serve_checks import (  # noqa: F401 - launch.check_capacity, launch._check_app_free (tests)
    _check_app_free,
    _check_proxy,
    _quiet_serve_reconnects,
    _replica_error,
    check_capacity,
)
from .net import (  # noqa: F401 - launch.free_port (bench, tests)
    _check_port,
    _check_reachable,
    _check_token,
    _connect_hint,
    _wait_healthy,
    client_head,
    free_port,
    health_url,
    on_node_url,
)

log = logging.getLogger("cloud_server.cluster")
INSTALL_HINT = "pip install 'hybridllm[cluster]'"
REMOTE_UNANSWERED_S = 30.0  # Ray Client: a proxy on the cluster that never answers here is out of reach


def require_ray() -> None:
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as exc:
        raise ServerError(f"--replicas needs Ray Serve, which is not installed: {INSTALL_HINT}") from exc


def init_ray(address: str | None, attempts: int = 3, **kwargs: Any) -> None:
    """``ray.init``, tried again when a local node times out starting (Ray waits 30 s for its
    raylet, which a busy machine can miss)."""
    import ray

    if address is not None:
        _check_reachable(address)
        _check_token(address)
    # ray.init installs its core's failure handler for SIGTERM over a Python one (it logs a stack
    # and aborts the process halfway through our cleanup): put the Python one back afterwards
    python_handler = signal.getsignal(signal.SIGTERM)
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address=address, namespace="hybridllm", log_to_driver=False, **kwargs)
            if callable(python_handler) and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, python_handler)
            return
        except ConnectionError as exc:
            if address is None:
                raise
            raise ServerError(f"{str(exc).rstrip('.')}. {_connect_hint(address)}") from exc
        except Exception as exc:
            if address is not None or "timed out during startup" not in str(exc) or attempt == attempts:
                raise
            log.warning("Ray's local node timed out starting (attempt %d); trying again", attempt)
            ray.shutdown()


def start(
    engine_config: EngineConfig,
    cluster: ClusterConfig,
    *,
    host: str,
    port: int,
    router: str = "tokens",
    power_watts: float | None = None,
    app_options: dict[str, Any] | None = None,
    ray_init: dict[str, Any] | None = None,
    board_name: str | None = None,
    deploying: Callable[[], None] | None = None,
) -> str:
    """Start Ray (or join ``cluster.ray_address``) and run the app; returns its base URL.
    The call returns once every replica has loaded its model. ``deploying`` is called just before
    the app is deployed (from then on the app is this run's to delete)."""
    require_ray()
    import ray
    from ray import serve

    from .app import APP_NAME, build_app, replica_num_gpus

    if port == 0:
        raise ServerError("--replicas needs an explicit --port (Ray Serve's proxy binds it)")
    if host.startswith("["):  # a URL's form: Serve's proxy (on every node) would fail to bind it
        raise ServerError(f"--host {host}: write an IPv6 address without brackets "
                          f"(--host {host.strip('[]')})")
    num_gpus = replica_num_gpus(engine_config)  # a bad --device before Ray starts
    if cluster.ray_address is None:
        _check_port(host, port)
    if not ray.is_initialized():
        init_ray(cluster.ray_address, **(ray_init or {}))
        if cluster.ray_address is None:
            check_capacity(cluster, ray.cluster_resources(), num_gpus=num_gpus)
    with _quiet_serve_reconnects():
        serve.start(http_options={"host": host, "port": port})
    if cluster.ray_address is not None:
        _check_app_free(APP_NAME, cluster.ray_address, replace=cluster.replace_app)
    _check_proxy(host, port, cluster.ray_address)  # after: another serve running there says more
    app = build_app(
        engine_config,
        cluster,
        router=router,
        app_options=app_options,
        power_watts=power_watts,
        board_name=board_name,
    )
    if deploying is not None:
        deploying()
    try:
        with _quiet_serve_reconnects():
            serve.run(app, name=APP_NAME, route_prefix="/")
    except RuntimeError as exc:  # Serve says only which deployment failed; say why
        reason = _replica_error(APP_NAME)
        if reason is None:
            raise
        raise ServerError(f"the engine replicas could not start: {reason}") from exc
    return _await_front_end(host, port, cluster.ray_address)


def _await_front_end(host: str, port: int, address: str | None) -> str:
    """Wait for the front end's ``/health`` where this machine reaches Serve's proxy; the app's URL.
    With Ray Client the proxy is on the cluster: one this machine cannot reach (loopback there,
    a firewall) is named, with how to check it there, instead of polled for minutes."""
    url = f"http://{host_port(host, port)}"  # an IPv6 address in brackets: http://[::1]:8000
    probe = health_url(host, port, address)
    if probe is None:
        log.warning("the app is served on the Ray cluster at %s, on %s of its head node (and of each "
                    "node with a replica): loopback there, out of this machine's reach, so its "
                    "/health is not checked from here. Check it on the head with `curl %s/health`; "
                    "to serve other machines, run again with --host 0.0.0.0", address,
                    host_port(host, port), on_node_url(host, port))
        return url
    if probe == url:
        _wait_healthy(url)
    elif not _wait_healthy(probe, unanswered_s=REMOTE_UNANSWERED_S):  # it runs there: kept, and said where
        log.warning("the app runs on the Ray cluster at %s, but %s/health does not answer from this "
                    "machine (a firewall between here and the head may block port %d): check it on "
                    "the head with `curl %s/health`", address, probe, port, on_node_url(host, port))
    return probe


def stop(cluster: ClusterConfig, board_name: str | None = None, *, drain: bool = True,
         delete_app: bool = True) -> None:
    """Delete the app, which drains it: Serve sends no new request to its replicas and gives those
    in flight up to ``cluster.graceful_shutdown_s`` to finish. On an existing cluster its fleet board
    ``board_name`` goes too once the app is gone, and the app only when ``delete_app`` (this run
    deployed it: a run stopped before, or refused, leaves another run's app alone); a local Ray is
    then stopped whole (at once when not ``drain``: a fleet that never served has nothing in
    flight). Not ``serve.shutdown()``: it adds Ray's own "graceful_shutdown failed ... killed by
    ray.kill" line."""
    import ray
    from ray import serve

    from .app import APP_NAME, NAMESPACE

    if not ray.is_initialized():
        return
    try:
        if cluster.ray_address is None:
            if drain:
                with contextlib.suppress(Exception):
                    serve.delete(APP_NAME)
        else:
            app_gone = not delete_app  # not ours to delete: the board, if any, is this run's alone
            try:
                if delete_app:
                    serve.delete(APP_NAME)
                    app_gone = True
            finally:
                if not app_gone:  # failed, or a second Ctrl-C: its replicas keep their CPUs (GPUs)
                    log.warning("the app %r is left on the Ray cluster at %s: the next `hybridllm-cloud "
                                "serve --replicas ... --ray-address %s --replace` takes it over (and "
                                "deletes it on exit), `serve shutdown` deletes every app there",
                                APP_NAME, cluster.ray_address, cluster.ray_address)
                # only once the app is gone: its replicas, still running after a failed deletion,
                # would create the board again at once (it goes with them instead)
                if board_name is not None and app_gone:
                    with contextlib.suppress(ValueError):  # never created (no replica started)
                        ray.kill(ray.get_actor(board_name, namespace=NAMESPACE))
                elif board_name is not None:
                    log.warning("the app %r was not deleted: its fleet board %r is left to go with "
                                "its replicas", APP_NAME, board_name)
    finally:
        if cluster.ray_address is None:
            ray.shutdown()


def serve_cluster(
    engine_config: EngineConfig,
    cluster: ClusterConfig,
    *,
    host: str,
    port: int,
    power_watts: float | None,
    app_options: dict[str, Any],
) -> int:
    require_ray()
    done = threading.Event()
    starting = [True]
    url = None
    board = f"hybridllm-fleet-{os.getpid()}-{time.monotonic_ns()}"  # deleted with the app
    deployed = threading.Event()  # this run deployed the app (so deletes it on the way out)
    ended = [False]  # the run ended without an error of its own (served, or stopped by a signal)

    def on_sigterm(*_: Any) -> None:
        done.set()
        if starting[0]:  # loading models or waiting for Ray: stop there, as Ctrl-C does
            starting[0] = False
            raise KeyboardInterrupt

    # ours for this run only: a library caller gets its own handler back on the way out
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        url = start(
            engine_config, cluster, host=host, port=port, power_watts=power_watts,
            app_options=app_options, board_name=board, deploying=deployed.set,
        )
        starting[0] = False
        replicas = (
            f"{cluster.min_replicas}..{cluster.max_replicas} (autoscaled)"
            if cluster.autoscaling
            else str(cluster.replicas)
        )
        log.info(
            "listening on %s%s: %s engine replicas on Ray Serve (%s)",
            url,
            f" (Ray Serve's proxy on the cluster at {cluster.ray_address})"
            if client_head(cluster.ray_address) else "",
            replicas,
            "API key required" if app_options.get("api_keys") else "open",
        )
        done.wait()
        ended[0] = True
    except KeyboardInterrupt:
        ended[0] = True
    except ServerError:
        raise
    except Exception as exc:  # Ray's own errors: one line, no traceback
        raise ServerError(f"the Ray Serve deployment failed: {type(exc).__name__}: {exc}") from exc
    finally:
        if ended[0] and url is not None:  # stopped while serving: say what the wait is for
            log.info("stopping: deleting the app, its answers in flight get up to %.0f s to finish%s",
                     cluster.graceful_shutdown_s, ", then the local Ray instance stops"
                     if cluster.ray_address is None else "; the Ray cluster keeps running")
        try:
            stop(cluster, board, drain=url is not None, delete_app=deployed.is_set())
        except Exception as exc:  # Ray's own (a joined cluster gone meanwhile): one line, no traceback
            if not ended[0]:  # the run's own error says more: it goes on, this one is logged
                log.warning("cleaning up after the failure failed too: %s: %s", type(exc).__name__, exc)
            elif isinstance(exc, ServerError):
                raise
            else:
                raise ServerError(f"stopping the Ray Serve app failed: {type(exc).__name__}: {exc}") from exc
        finally:
            if previous is not None:  # None: a handler not set from Python, nothing to restore
                signal.signal(signal.SIGTERM, previous)
    return 0
