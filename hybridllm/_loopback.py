"""What "this machine" (loopback) is to `hybridllm serve`, in one place: its Origin check and CORS
(a page served from this machine may call it), its Host allowlist (DNS rebinding) and its warning
when it serves without an API key off loopback. Standard library only: `hybridllm serve` reads it
while parsing its arguments, before FastAPI loads."""

from __future__ import annotations

import ipaddress
import re

# the names clients use for this machine, in the spelling ``host_name`` gives; the Host allowlist
# starts from them and errors quote them (any other loopback address is loopback too: is_loopback)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")

# scheme://host[:port], as a browser writes Origin; the host is a bracketed IPv6 address or a name
# without ':', '/', '@' (userinfo never appears in an Origin)
_ORIGIN = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[^:/@\[\]\s]+)(?::\d{1,5})?")


def host_name(value: str) -> str:
    """The name in a Host header (or a bind address) without its port, in one spelling:
    ``[::1]:8080`` -> ``::1``, ``LocalHost.:80`` -> ``localhost``, ``0:0::1`` -> ``::1``."""
    value = value.strip().lower()
    if value.startswith("["):  # an IPv6 address, in brackets when a port may follow
        name = value[1:].split("]", 1)[0]
    else:  # one ':' is a port; more are an IPv6 address written without brackets
        name = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
    name = name.rstrip(".")
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address, bracketed or not, with or without a port) names this
    machine only: ``localhost``, any of 127.0.0.0/8 (the whole block is loopback, not just .1),
    ``::1``, and 127.x written as an IPv4-mapped IPv6 address (``::ffff:127.0.0.1``)."""
    name = host_name(host)
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # another name: what it resolves to is the network's say, not this machine's
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def is_loopback_origin(origin: str) -> bool:
    """Whether a browser's ``Origin`` is a page served from this machine (http or https, a loopback
    host, any port). ``null`` (a sandboxed frame, a file) is not."""
    match = _ORIGIN.fullmatch(origin.strip())
    return match is not None and is_loopback(match.group(1))
