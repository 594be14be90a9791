"""What Ray Serve reports, read around the cluster launch's deploy: a proxy already running with
other HTTP options (or none), an app of the same name on a joined cluster, room for the replicas on
a local Ray, the reason a replica failed, and Serve's reconnect line kept out of the log.

Split from ``launch`` (its size); ``launch.check_capacity`` and ``launch._check_app_free`` are these.
Ray is imported inside each check, as in ``launch``: importing this module starts nothing.
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Any

from hybridllm._cli_options import host_port

from ..config import ClusterConfig
from ..exceptions import ServerError

log = logging.getLogger("cloud_server.cluster")


def _not_a_reconnect(record: logging.LogRecord) -> bool:
    return "New http_options/controller_options will not be applied" not in record.getMessage()


@contextlib.contextmanager
def _quiet_serve_reconnects() -> Any:
    """Without Serve's "Connecting to existing Serve app ... New http_options/controller_options
    will not be applied.": ``serve.run`` logs it right after this command's own ``serve.start``
    (whose options were applied), and on a cluster that already runs Serve ``_check_proxy`` says
    in one line whether its host and port are the ones asked for. Any other line is kept."""
    logger = logging.getLogger("ray.serve")
    logger.addFilter(_not_a_reconnect)
    try:
        yield
    finally:
        logger.removeFilter(_not_a_reconnect)


def _check_proxy(host: str, port: int, address: str | None) -> None:
    """Serve keeps the HTTP options it was first started with: where it already runs (a cluster
    we joined), ``serve.start`` only logs that ours are ignored, and its proxy listens elsewhere
    (``_wait_healthy`` then polled a port nobody serves for minutes). Refuse at once, saying where
    it listens."""
    try:
        from ray.serve.context import _get_global_client  # Serve's client: its http_config is the proxy's

        client = _get_global_client()
        assert client is not None  # serve.start ran: else the except below, as unreadable
        have_host, have_port = client.http_config.host, int(client.http_config.port)
    except Exception:  # unreadable (Ray's private API moved): _wait_healthy says what is wrong
        return
    where = f"the Ray cluster at {address}" if address is not None else "this Ray instance"
    stop_it = (
        "or stop Serve there first with `serve shutdown` on a node of the cluster (it deletes "
        "every Serve app there)"
    )
    if have_host is None or _proxy_disabled(client):  # Serve started without HTTP proxies
        raise ServerError(
            f"Ray Serve already runs on {where} without an HTTP proxy (its proxy_location is "
            f"Disabled), so the app would not be reachable on {host_port(host, port)}: run Serve "
            f"there with proxy_location EveryNode or HeadOnly (in the Serve config it was deployed "
            f"with, or `serve shutdown` then `serve start --proxy-location EveryNode --http-host "
            f"{host} --http-port {port}` on a node of the cluster; `serve shutdown` deletes every "
            f"Serve app there)"
        )
    if (str(have_host).strip("[]"), have_port) == (host.strip("[]"), port):
        return
    raise ServerError(
        f"Ray Serve already runs on {where}, its proxy listening on {host_port(have_host, have_port)}, "
        f"not on the {host_port(host, port)} asked for (Serve keeps the HTTP options it was started "
        f"with): pass --host {have_host} --port {have_port}, {stop_it}"
    )


def _proxy_disabled(client: Any) -> bool:
    """Whether Serve runs with proxy_location Disabled (older Rays: NoServer), its HTTP options
    as set as ever: newer Rays keep the location beside them (in Serve's details), older ones in
    them. Unreadable: not known to be disabled."""
    places = [getattr(client.http_config, "location", None)]
    with contextlib.suppress(Exception):
        places.append(client.get_serve_details().get("proxy_location"))
    return any(str(getattr(place, "value", place)) in ("Disabled", "NoServer") for place in places)


def _check_app_free(app_name: str, address: str, *, replace: bool) -> None:
    """Refuse to deploy over an app of the same name on a cluster we joined: ``serve.run`` would
    replace it without a word (another ``hybridllm-cloud serve --replicas`` would lose its
    replicas mid-answer), and stopping this run would then delete it. ``replace`` (``--replace``)
    takes over one left behind by a run that was killed before it could delete its app."""
    from ray import serve

    try:
        app = serve.status().applications.get(app_name)
    except Exception:  # Serve's status unreadable: serve.run says what is wrong, if anything
        return
    if app is None:
        return
    status = str(getattr(app, "status", "")).rsplit(".", 1)[-1] or "unknown"
    if replace:
        log.warning(
            "replacing the app %r already on the cluster at %s (%s), as --replace asks",
            app_name,
            address,
            status,
        )
        return
    raise ServerError(
        f"an app named {app_name!r} already runs on the Ray cluster at {address} ({status}), deployed "
        "by another `hybridllm-cloud serve --replicas`: deploying this one would replace it, and "
        "stopping this one would delete it. Stop that command first (Ctrl-C or SIGTERM deletes its "
        "app), or, if it was killed and left its app behind, add --replace"
    )


def check_capacity(cluster: ClusterConfig, resources: dict[str, float], *, num_gpus: int = 0) -> None:
    """Refuse replicas that a local Ray cannot place: it never grows, and Serve would wait for the
    CPUs (or GPUs) for ever, ``serve.run`` with it, saying nothing. On a cluster Ray's autoscaler
    may add nodes, so this is checked for a local instance only. ``num_gpus``: per replica."""
    need = {"CPU": cluster.replica_cpus}
    if num_gpus:
        need["GPU"] = float(num_gpus)
    for name, per_replica in need.items():
        have = float(resources.get(name, 0.0))
        fits = int(have // per_replica)
        if fits < cluster.replicas:
            fewer = f"ask for at most {fits} replicas, or " if fits else ""
            raise ServerError(
                f"--replicas {cluster.replicas} needs {cluster.replicas * per_replica:g} {name}s "
                f"({per_replica:g} per replica) and the local Ray instance has {have:g}: {fewer}join "
                f"a cluster that has them with --ray-address"
            )
        if cluster.autoscaling and cluster.max_replicas is not None and fits < cluster.max_replicas:
            log.warning(
                "--max-replicas %d: the local Ray instance has %g %ss, room for %d replicas",
                cluster.max_replicas,
                have,
                name,
                fits,
            )


_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(\w*(?:Error|Exception)): (.+)$")


def _replica_error(app_name: str) -> str | None:
    """The last exception line of a failed deployment's message (the replica's traceback), as
    ``ConfigError: ...``; None when Serve reports no failed deployment."""
    from ray import serve

    try:
        app = serve.status().applications.get(app_name)
    except Exception:
        return None
    for deployment in app.deployments.values() if app is not None else ():
        if "FAILED" not in str(deployment.status) and "UNHEALTHY" not in str(deployment.status):
            continue
        for line in reversed((deployment.message or "").splitlines()):
            match = _EXCEPTION_LINE.match(line.strip())
            if match:
                return f"{match.group(1)}: {match.group(2)}"
        if deployment.message:
            return deployment.message.strip().splitlines()[-1]
    return None
