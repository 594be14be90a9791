"""The proxy's guards against web pages: the Origin check with its CORS, and the Host allowlist."""

from __future__ import annotations

import argparse
import ipaddress

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ._loopback import LOOPBACK_NAMES, host_name, is_loopback, is_loopback_origin
from ._serve_cli import web_origin
from .wire import WireError, header_value
from .wire.cors import JsonErrorCORS


class LoopbackCORS(JsonErrorCORS):
    """CORS for the origins allowed and for every page served from this machine (a local chat UI on
    http://localhost:3000, http://127.0.0.2:8000): the same test as the Origin check
    (``is_loopback_origin``). A hostile site's page has its own origin, whatever address it makes
    the browser call. A refused preflight is OpenAI's JSON error; for a page whose origin is not let
    in, the POST's own message with its advice (:func:`cross_site`)."""

    def is_allowed_origin(self, origin: str) -> bool:
        return is_loopback_origin(origin) or super().is_allowed_origin(origin)

    def origin_refused(self, origin: str) -> WireError:
        return cross_site(origin)


def cross_site(origin: str) -> WireError:
    """The refusal of a request a web page sent (browsers add ``Origin``; programs do not). A page
    on any site the user visits can POST to 127.0.0.1 without asking first (a "simple" request,
    ``text/plain``): unrefused, it would use the device and force the operator's cloud."""
    shown = header_value(origin, 200)
    try:
        web_origin(shown)
        advice = f"To let this page call it, start `hybridllm serve` with --allow-origin {shown}."
    except argparse.ArgumentTypeError:  # `null` (a file, a sandboxed frame): no origin to name
        advice = ("A page without an origin of its own (a file, a sandboxed frame) is let in only "
                  "by --allow-origin '*' (every page), or serve it from http://localhost.")
    return WireError(f"This server does not answer requests from web pages (Origin: {shown}): any site "
                     f"could otherwise use it. {advice}", status=403, code="origin_not_allowed")


def serve_hosts(bound: str, allowed: list[str]) -> list[str] | None:
    """The Host names ``hybridllm serve`` answers when bound to ``bound`` (None: any).

    On loopback a DNS-rebinding page (a site whose name the attacker points at 127.0.0.1 after the
    page loaded) is same-origin to the browser, so it sends no ``Origin`` and can read GET answers;
    its requests still carry the site's name as Host. So: the loopback names, the bound address and
    ``allowed`` (a reverse proxy's public name). On another address the operator exposed the server
    to a network that reaches it under names and addresses this process cannot know: any Host,
    unless ``allowed`` names some; ``*`` is any Host."""
    if "*" in allowed:
        return None
    try:
        address = ipaddress.ip_address(host_name(bound))
    except ValueError:
        address = None
    if not is_loopback(bound) and not allowed:
        return None
    names = [*LOOPBACK_NAMES, *allowed]
    if address is not None and not address.is_unspecified:  # 0.0.0.0 is no name a client uses
        names.append(str(address))
    return list(dict.fromkeys(host_name(n) for n in names))


def wrong_host(host: str, allowed: list[str]) -> WireError:
    shown = header_value(host, 200)
    return WireError(
        f"This server does not answer requests addressed to {shown!r} (the Host header): a web page "
        f"could otherwise read it through DNS rebinding. It answers {', '.join(allowed)}. If clients "
        f"reach it under that name (a reverse proxy, a LAN name), start `hybridllm serve` with "
        f"--allow-host {host_name(shown) or shown}.", status=403, code="host_not_allowed")


class HostAllowlist:
    """ASGI middleware: a request whose Host header names none of ``hosts`` is a 403, on every
    path. A request without Host (HTTP/1.0) is let through: every browser sends one. A list that
    holds a loopback name admits every loopback address (``is_loopback``: 127.0.0.2 too): a page
    whose Host is such an address was itself served from this machine, no rebinding site."""

    def __init__(self, app: ASGIApp, hosts: list[str]) -> None:
        self.app = app
        self.hosts = {host_name(h) for h in hosts}
        self.shown = list(dict.fromkeys(hosts))
        self.loopback = any(is_loopback(h) for h in hosts)

    def admits(self, host: str) -> bool:
        return host_name(host) in self.hosts or (self.loopback and is_loopback(host))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
            if host is not None and not self.admits(host):
                response = JSONResponse(wrong_host(host, self.shown).body(), 403)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
