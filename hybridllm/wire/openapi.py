"""OpenAPI pieces for routes that read their JSON body by hand.

The servers parse bodies themselves (size limit, strict JSON, order of checks), so FastAPI does
not see a body parameter; these helpers put the real request schema and the error responses into
the document, so that clients and API fuzzers see what the route actually accepts.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from .responses import ErrorResponse

REF = "#/components/schemas/{model}"

ERROR_TEXT = {
    400: "Invalid request (OpenAI error JSON)",
    401: "Missing or wrong API key",
    403: "A request from a web page whose origin this server does not allow",
    404: "Unknown model",
    408: "The request body did not arrive whole in time (code request_timeout); the connection is "
         "closed",
    413: "Request body too large",
    429: "Too many requests now (a full queue, a rate limit or a spent budget); retry after the "
         "Retry-After header",
    500: "Internal error",
    502: "The upstream answered with an error",
    503: "Cannot serve now (loading, shutting down, or its upstream unavailable); retry after the "
         "Retry-After header",
}


def request_body(
    model: type[BaseModel], defs: dict[str, Any], *, neutral_only: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``openapi_extra`` declaring ``model`` as the JSON body; its sub-schemas go into ``defs``.
    ``neutral_only``: fields this server accepts only at the given value (say so in the schema)."""
    schema = model.model_json_schema(ref_template=REF)
    for name, value in (neutral_only or {}).items():
        prop = schema["properties"][name]
        nullable = any(alt.get("type") == "null" for alt in prop.get("anyOf", ()))
        only = {"const": value}
        schema["properties"][name] = {"anyOf": [only, {"type": "null"}]} if nullable else only
    defs.update(schema.pop("$defs", {}))
    defs[model.__name__] = schema
    ref = {"$ref": REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorResponse, "description": ERROR_TEXT.get(s, "Error")} for s in statuses}


def ok_response(model: type[BaseModel], *, streams: bool) -> dict[int | str, dict[str, Any]]:
    """200 as ``model`` JSON, and as an SSE stream when the route can stream."""
    content: dict[str, Any] = {}
    if streams:
        # each event: "data: <chunk JSON>" lines, the last one "data: [DONE]"
        event = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
        content["text/event-stream"] = {"schema": event}
    return {200: {"model": model, "description": "Success", "content": content}}


def add_schemas(app: Any, defs: dict[str, Any]) -> None:
    """Merge ``defs`` into the app's generated document (once, when it is first built)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = build()
            doc.setdefault("components", {}).setdefault("schemas", {}).update(defs)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
