"""Network checks of the cluster launch, before Ray starts: a port free to listen on, a Ray head that
takes a connection and this process's token, what to check when joining one fails, and where (and
whether) this machine reaches the app's Serve proxy to wait for its front end."""

from __future__ import annotations

import ipaddress
import logging
import os
import random
import socket
import time
from typing import Any

from hybridllm._cli_options import host_port
from hybridllm._loopback import is_loopback

from ..exceptions import ServerError

log = logging.getLogger("cloud_server.cluster")


def _host_and_port(target: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (an IPv6 host in brackets) as (host without brackets, port); None otherwise."""
    host, sep, port = target.rpartition(":")
    return (host.strip("[]"), int(port)) if sep and host and port.isdigit() else None


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, not after Ray's minutes of retries, when ``HOST:PORT`` (the head's GCS)
    or ``ray://HOST:PORT`` takes no TCP connection. ``auto`` and other forms are left to Ray."""
    target = _host_and_port(address[len("ray://"):] if address.startswith("ray://") else address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout_s):
            pass
    except OSError as exc:
        raise ServerError(
            f"nothing answers at --ray-address {address} ({exc.strerror or exc}): start the head with "
            f"`ray start --head` (it prints the address to use) or check the host and port"
        ) from exc


_CLUSTER_ID_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"  # what ray.init asks the GCS first


def _check_token(address: str, timeout_s: float = 5.0) -> None:
    """Fail at once when the head at ``HOST:PORT`` turns this process's token away (or its lack of
    one): ``ray.init`` retries that answer for 20 s before its "Failed to connect". One call to the
    GCS with the metadata Ray itself would send; any other answer (or none), and a Ray whose private
    token helpers this cannot import or call, are left to Ray."""
    if address.startswith("ray://") or _host_and_port(address) is None:
        return  # Ray Client has a server of its own; "auto" finds a local cluster and its token
    try:
        import grpc
        from ray._private.authentication.authentication_utils import is_token_auth_enabled
        from ray._private.authentication.grpc_authentication_client_interceptor import (
            SyncAuthenticationMetadataClientInterceptor as WithToken,
        )
    except ImportError:  # another Ray: its own connect, however long it takes
        return
    channel = grpc.insecure_channel(address)
    try:
        if is_token_auth_enabled():  # the token Ray would send (read once a process, as Ray reads it)
            channel = grpc.intercept_channel(channel, WithToken())
        # GetClusterIdRequest has no fields: its encoding is empty
        channel.unary_unary(_CLUSTER_ID_METHOD)(b"", timeout=timeout_s)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            reason = (exc.details() or "authentication failed").rstrip(".")
            raise ServerError(
                f"the Ray cluster at --ray-address {address} turned this process away ({reason}). "
                f"{_connect_hint(address)}"
            ) from None
    except Exception as exc:  # noqa: BLE001 - private Ray API: a Ray that changed it connects its own way
        log.debug("token check of %s skipped: %s: %s", address, type(exc).__name__, exc)
    finally:
        channel.close()


def client_head(address: str | None) -> str | None:
    """The head's host in a Ray Client address (``ray://HOST:PORT``, an IPv6 one without its
    brackets); None for any other address (``auto``, ``HOST:PORT``: the driver runs on a node)."""
    if address is None or not address.startswith("ray://"):
        return None
    host = address[len("ray://"):].rpartition(":")[0].strip("[]")
    return host or None


def _every_interface(host: str) -> bool:
    try:
        return host == "" or ipaddress.ip_address(host).is_unspecified  # 0.0.0.0, ::
    except ValueError:
        return False


def health_url(host: str, port: int, address: str | None) -> str | None:
    """Where this machine reaches the Serve proxy that listens on ``host:port``. With Ray Client
    (``ray://HEAD:PORT``) the proxy runs on the cluster (its head node always), not here: one on
    every interface is reached at HEAD, one on a given address there, and one on loopback only
    from the cluster's own nodes (None: nothing on this machine can reach it)."""
    head = client_head(address)
    bare = host.strip("[]")
    if head is None:
        return f"http://{host_port(bare, port)}"
    if _every_interface(bare):
        return f"http://{host_port(head, port)}"
    return None if is_loopback(bare) else f"http://{host_port(bare, port)}"


def on_node_url(host: str, port: int) -> str:
    """The URL of a proxy listening on ``host:port`` from a node it runs on (every interface: loopback)."""
    bare = host.strip("[]")
    if _every_interface(bare):
        bare = "::1" if ":" in bare else "127.0.0.1"
    return f"http://{host_port(bare, port)}"


def _connect_hint(address: str) -> str:
    """What to check when joining ``address`` fails. Ray sends its token to an explicit address
    only when told to (``RAY_AUTH_MODE=token``); ``auto`` finds a local cluster and its token."""
    if address == "auto":
        return ("--ray-address auto joins a cluster that runs on this machine (`ray start --head` "
                "starts one); without --ray-address a local Ray instance is started for this command")
    # Ray Client (ray://): a server of its own on the head, which takes only its own Ray and Python
    what = ("the head's Ray Client server (`ray start --head` runs it on port 10001 unless "
            "--ray-client-server-port says otherwise) and that this machine has the cluster's Ray and "
            "Python versions (Ray Client needs the same)" if address.startswith("ray://")
            else "the head's GCS address (ray start --head prints it)")
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return (f"Check that the address is {what}, and that this token (RAY_AUTH_TOKEN, "
                "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) is the cluster's")
    return (f"Check that the address is {what}. A cluster with token authentication (the default of "
            "`ray start` when a token exists) needs RAY_AUTH_MODE=token and its token in "
            "RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token; on a node of the cluster, "
            "--ray-address auto finds both")


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, below the OS's ephemeral range (and above Ray's worker ports, 10002-19999).

    A port picked by binding port 0 is an ephemeral one, and while a cluster starts Ray's own
    processes take ephemeral ports: one of them can take it before Serve's proxy binds it ("Failed
    to bind to address"). Ports between 20000 and the ephemeral range are handed out to nobody."""
    low, high = 20000, 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
            high = min(high, int(fh.read().split()[0]))
    except (OSError, ValueError, IndexError):
        pass  # not Linux: 32768 is below the ephemeral ranges of macOS and Windows (49152)
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(low, max(high, low + 1))
        try:
            _check_port(host, port)
        except ServerError:
            continue
        return port
    raise ServerError(f"no free port between {low} and {high} on {host}")


def _check_port(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ServerError(f"cannot listen on {host_port(host, port)}: {exc.strerror or exc}") from exc


def _wait_healthy(url: str, timeout_s: float = 300.0, unanswered_s: float | None = None) -> bool:
    """``serve.run`` returns when the deployments are up, but the front end still builds its
    OpenAI layer in the background (503 "still loading" meanwhile): wait for ``/health`` to say
    ``ok``. A fleet that is only ``degraded`` by then still serves (logged); none is an error.
    False when no HTTP answer at all came within ``unanswered_s`` (a proxy out of reach)."""
    import httpx

    start = time.monotonic()
    deadline, answered = start + timeout_s, False
    last: Any = None
    while time.monotonic() < deadline:
        try:
            # straight to the port Serve listens on: HTTP_PROXY & co (a corporate proxy) cannot reach it
            resp = httpx.get(f"{url}/health", timeout=5.0, trust_env=False)
            last, answered = (resp.status_code, resp.text[:200]), True
            if resp.status_code == 200 and resp.json().get("status") == "ok":
                return True
        except (httpx.HTTPError, ValueError) as exc:
            last = exc
        if unanswered_s is not None and not answered and time.monotonic() - start > unanswered_s:
            return False
        time.sleep(0.25)
    if isinstance(last, tuple) and last[0] == 200:
        log.warning("the cluster serves, but not every replica is up yet: %s", last[1])
        return True
    raise ServerError(f"the cluster did not become healthy within {timeout_s:.0f} s (last /health: "
                      f"{last}); see Ray's logs under /tmp/ray/session_latest/logs")
