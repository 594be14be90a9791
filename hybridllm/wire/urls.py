"""The hint a 404 gives: the route a mistyped path was likely meant for (both servers use it)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Match, get_route_path


def url_hint(request: Request) -> str:
    """The route a 404's path was likely meant for, as a hint: a client whose base URL lacks
    ``/v1`` (``base_url="http://host:8000"``: ``POST /chat/completions``) or joins it with a
    doubled slash (``/v1//chat/completions``) got a bare "Invalid URL", which did not say what to
    change. Only a route that takes this method is named; "" when none fits."""
    scope = request.scope
    route_path = get_route_path(scope)
    root = scope["path"][: len(scope["path"]) - len(route_path)]  # the app's root path, if any
    tidy = "/" + "/".join(part for part in route_path.split("/") if part)
    for candidate in dict.fromkeys((tidy, "/v1" + tidy)):
        if candidate == route_path:
            continue
        probe = {**scope, "path": root + candidate}
        if any(route.matches(probe)[0] == Match.FULL for route in request.app.router.routes):
            where = (" (an OpenAI client's base_url for this server ends in /v1: http://HOST:PORT/v1)"
                     if candidate != tidy else "")
            return f"; did you mean {request.method} {candidate}?{where}"
    return ""
