"""Network checks of the cluster launch, without Ray: a port free to listen on, a Ray head that
takes a connection, and what to check when joining one fails."""

from __future__ import annotations

import os
import random
import socket

from hybridllm._cli_options import host_port

from ..exceptions import ServerError


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, not after Ray's minutes of retries, when ``HOST:PORT`` (the head's GCS)
    or ``ray://HOST:PORT`` takes no TCP connection. ``auto`` and other forms are left to Ray."""
    target = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ServerError(
            f"nothing answers at --ray-address {address} ({exc.strerror or exc}): start the head with "
            f"`ray start --head` (it prints the address to use) or check the host and port"
        ) from exc


def _connect_hint(address: str) -> str:
    """What to check when joining ``address`` fails. Ray sends its token to an explicit address
    only when told to (``RAY_AUTH_MODE=token``); ``auto`` finds a local cluster and its token."""
    if address == "auto":
        return ("--ray-address auto joins a cluster that runs on this machine (`ray start --head` "
                "starts one); without --ray-address a local Ray instance is started for this command")
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return ("Check that the address is the head's GCS address (ray start --head prints it) and "
                "that this token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) is the "
                "cluster's")
    return ("Check that the address is the head's GCS address (ray start --head prints it). A "
            "cluster with token authentication (the default of `ray start` when a token exists) "
            "needs RAY_AUTH_MODE=token and its token in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
            "~/.ray/auth_token; on a node of the cluster, --ray-address auto finds both")


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
