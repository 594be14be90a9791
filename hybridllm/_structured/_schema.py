"""OpenAI's ``response_format`` read into a grammar: ``json_object`` or a JSON Schema subset."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from . import _graph as n

MAX_SCHEMA_BYTES = 256 * 1024  # a schema's JSON, at most
MAX_LITERAL_BYTES = 4096  # one enum option's or const's JSON, at most

# Keywords that describe a value without constraining it: read past.
_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "discriminator", "strict",
})
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_BY_TYPE = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "minItems", "maxItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": set(_BOUNDS), "integer": set(_BOUNDS), "boolean": set(), "null": set(),
}
_GENERAL = {"type", "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions", "nullable"}
_KNOWN = _GENERAL | set().union(*_BY_TYPE.values()) | _ANNOTATIONS


class ResponseFormatError(ValueError):
    """A ``response_format`` that cannot be served; ``param`` names the field at fault."""

    def __init__(self, message: str, param: str = "response_format") -> None:
        super().__init__(message)
        self.message, self.param = message, param


class _Compiler:
    def __init__(self, schema: Any, base: str) -> None:
        self.defs: dict[str, Any] = {}
        self.where: dict[str, str] = {}  # a definition's place, for errors inside it
        if isinstance(schema, Mapping):
            for key in ("$defs", "definitions"):
                found = schema.get(key)
                if found is not None:
                    if not isinstance(found, Mapping):
                        raise ResponseFormatError(f"'{key}' must be an object of schemas.", f"{base}.{key}")
                    self.defs.update({f"#/{key}/{name}": value for name, value in found.items()})
                    self.where.update({f"#/{key}/{name}": f"{base}.{key}.{name}" for name in found})
        self.done: dict[str, n.Node] = {}
        self.open: set[str] = set()

    def compile(self, schema: Any, path: str) -> n.Node:
        if schema is True or schema == {}:
            return n.ANY_VALUE
        if schema is False:
            raise ResponseFormatError("A schema of false allows no value at all.", path)
        if not isinstance(schema, Mapping):
            raise ResponseFormatError("A schema must be an object (or true).", path)
        unknown = [k for k in schema if k not in _KNOWN]
        if unknown:
            raise ResponseFormatError(
                f"The JSON Schema keyword '{unknown[0]}' is not supported in response_format (supported: "
                "type, properties, required, additionalProperties, items, minItems, maxItems, enum, const, "
                "anyOf, oneOf, minLength, maxLength, pattern, format, minimum, maximum, $ref to "
                "$defs). Remove it and check "
                "the value yourself.",
                f"{path}.{unknown[0]}")
        if "$ref" in schema:
            return self._ref(schema["$ref"], f"{path}.$ref")
        if "const" in schema:
            return n.literal([_literal(schema["const"], f"{path}.const")])
        if "enum" in schema:
            options = schema["enum"]
            if not isinstance(options, list) or not options:
                raise ResponseFormatError("'enum' must be a non-empty array.", f"{path}.enum")
            return n.literal([_literal(v, f"{path}.enum") for v in options])
        for key in ("anyOf", "oneOf"):  # oneOf's "exactly one" is not enforced: any branch may match
            if key in schema:
                branches = schema[key]
                if not isinstance(branches, list) or not branches:
                    raise ResponseFormatError(f"'{key}' must be a non-empty array of schemas.",
                                              f"{path}.{key}")
                rest = {k: v for k, v in schema.items() if k not in (key, *_ANNOTATIONS)}
                if rest:  # shared keywords beside the branches: each branch takes them
                    branches = [{**rest, **b} if isinstance(b, Mapping) else b for b in branches]
                return n.choice(self.compile(b, f"{path}.{key}[{i}]") for i, b in enumerate(branches))
        types = schema.get("type")
        if types is None:
            types = [t for t in ("object", "array", "string", "number") if _BY_TYPE[t] & set(schema)]
            if not types:
                return n.ANY_VALUE
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, list) or not types or not all(isinstance(t, str) for t in types):
            raise ResponseFormatError("'type' must be a type name or a non-empty array of them.",
                                      f"{path}.type")
        if schema.get("nullable") is True and "null" not in types:
            types = [*types, "null"]
        nodes = []
        for t in dict.fromkeys(types):
            if t not in _BY_TYPE:
                raise ResponseFormatError(
                    f"Unknown type '{t}': use object, array, string, number, integer, boolean or null.",
                    f"{path}.type")
            nodes.append(self._typed(t, schema, path))
        return n.choice(nodes)

    def _ref(self, ref: Any, path: str) -> n.Node:
        if not isinstance(ref, str) or ref not in self.defs:
            raise ResponseFormatError(
                f"'$ref' {ref!r} does not name a schema in this schema's $defs (only local "
                "'#/$defs/Name' references are supported).", path)
        if ref in self.done:
            return self.done[ref]
        if ref in self.open:
            raise ResponseFormatError(
                f"'$ref' {ref!r} refers to itself: recursive schemas are not supported.", path)
        self.open.add(ref)
        node = self.compile(self.defs[ref], self.where[ref])
        self.open.discard(ref)
        self.done[ref] = node
        return node

    def _typed(self, t: str, schema: Mapping, path: str) -> n.Node:
        if t == "null":
            return n.literal([b"null"])
        if t == "boolean":
            return n.literal([b"true", b"false"])
        if t in ("number", "integer"):
            return _numeric(t, schema, path)
        if t == "string":
            lo = _count(schema, "minLength", path, 0)
            hi = _count(schema, "maxLength", path, None)
            if hi is not None and hi < lo:
                raise ResponseFormatError("maxLength is below minLength.", f"{path}.maxLength")
            regex = _string_regex(schema, path)
            if regex is None:
                return n.string(lo, hi)
            if not regex.fits(regex.start, lo, hi):
                raise ResponseFormatError("No string of the length minLength / maxLength allow matches "
                                          "the pattern or format.", f"{path}.maxLength" if hi is not None
                                          else f"{path}.minLength")
            return n.pattern(regex, lo, hi)
        if t == "array":
            lo = _count(schema, "minItems", path, 0)
            hi = _count(schema, "maxItems", path, None)
            if hi is not None and hi < lo:
                raise ResponseFormatError("maxItems is below minItems.", f"{path}.maxItems")
            items = schema.get("items", True)
            if isinstance(items, list):
                raise ResponseFormatError("'items' must be one schema (tuple forms are not supported).",
                                          f"{path}.items")
            return n.array(self.compile(items, f"{path}.items"), lo, hi)
        return self._object(schema, path)

    def _object(self, schema: Mapping, path: str) -> n.Node:
        props = schema.get("properties") or {}
        if not isinstance(props, Mapping):
            raise ResponseFormatError("'properties' must be an object of schemas.", f"{path}.properties")
        required = schema.get("required") or []
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ResponseFormatError("'required' must be an array of property names.", f"{path}.required")
        missing = [r for r in required if r not in props]
        other_schema = schema.get("additionalProperties", False)
        if missing and other_schema is False:
            raise ResponseFormatError(
                f"'{missing[0]}' is required but not among the properties (and no other keys are "
                "allowed): add it to 'properties'.", f"{path}.required")
        if missing:
            raise ResponseFormatError(
                f"'{missing[0]}' is required but not among the properties: add it to 'properties' "
                "(required keys are produced in the properties' order).", f"{path}.required")
        compiled = []
        for name, sub in props.items():
            if not isinstance(name, str):
                raise ResponseFormatError("Property names must be strings.", f"{path}.properties")
            key = json.dumps(name, ensure_ascii=False)[1:].encode()  # the name as JSON, closing quote on
            compiled.append((name, key, self.compile(sub, f"{path}.properties.{name}"), name in required))
        if other_schema is False:
            other = None
        else:
            other = self.compile(other_schema, f"{path}.additionalProperties")
        return n.obj(tuple(compiled), other)


MAX_BOUND = 10**30  # the largest integer bound served (a number is at most MAX_NUMBER bytes)


def _numeric(t: str, schema: Mapping, path: str) -> n.Node:
    """A number, or one within minimum / maximum / exclusiveMinimum / exclusiveMaximum: an
    integer within any bounds, a number within whole-number bounds."""
    import math

    given = [k for k in _BOUNDS if k in schema]
    if not given:
        return n.number(t == "integer")
    low: tuple[float, bool] | None = None  # (bound, inclusive), the tighter of those given
    high: tuple[float, bool] | None = None
    for key in given:
        value = schema[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ResponseFormatError(f"'{key}' must be a number (the boolean form of older drafts is "
                                      "not supported).", f"{path}.{key}")
        if abs(value) > MAX_BOUND:
            raise ResponseFormatError(f"'{key}' is beyond +-1e30, the widest bound served.",
                                      f"{path}.{key}")
        if t == "number" and value != int(value):
            raise ResponseFormatError(
                f"'{key}' {value} is not a whole number: a number's bounds are served when they are "
                "whole (0, 1, 100, ...); remove it and check the value yourself.", f"{path}.{key}")
        bound = (value, key in ("minimum", "maximum"))
        if key.endswith("inimum"):  # the larger lower bound; at a tie the exclusive one
            low = bound if low is None or (value, not bound[1]) > (low[0], not low[1]) else low
        else:
            high = bound if high is None or (value, bound[1]) < (high[0], high[1]) else high
    from ._patterns import integer_range, number_range
    from ._regex import compiled

    try:
        if t == "integer":
            lo = None if low is None else (math.ceil(low[0]) if low[1] else math.floor(low[0]) + 1)
            hi = None if high is None else (math.floor(high[0]) if high[1] else math.ceil(high[0]) - 1)
            if lo is not None and hi is not None and lo > hi:
                raise ValueError("No integer lies within minimum / maximum.")
            return n.ranged(compiled(integer_range(lo, hi)))
        return n.ranged(compiled(number_range(None if low is None else (int(low[0]), low[1]),
                                           None if high is None else (int(high[0]), high[1]))))
    except ValueError as exc:
        message = str(exc)
        raise ResponseFormatError(message[0].upper() + message[1:].rstrip(".") + ".",
                                  f"{path}.{given[-1]}") from None


def _string_regex(schema: Mapping, path: str) -> Any:
    """The compiled ``pattern`` or ``format`` of a string schema; None without either."""
    from ._patterns import FORMATS
    from ._regex import compiled

    if "pattern" in schema and "format" in schema:
        raise ResponseFormatError("A string with both 'pattern' and 'format' is not supported: keep one "
                                  "(a format is a pattern too, see the README).", f"{path}.format")
    if "format" in schema:
        name = schema["format"]
        if name not in FORMATS:
            raise ResponseFormatError(
                f"The string format {name!r} is not supported (supported: {', '.join(FORMATS)}); use "
                "'pattern' instead, or remove it and check the value yourself.", f"{path}.format")
        return compiled(FORMATS[name])
    if "pattern" in schema:
        pattern = schema["pattern"]
        if not isinstance(pattern, str):
            raise ResponseFormatError("'pattern' must be a string.", f"{path}.pattern")
        try:
            return compiled(pattern)
        except ValueError as exc:
            raise ResponseFormatError(f"The pattern cannot be served: {exc}.", f"{path}.pattern") from None
    return None


def _count(schema: Mapping, key: str, path: str, default: int | None) -> Any:
    value = schema.get(key, default)
    if value is default:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ResponseFormatError(f"'{key}' must be a whole number >= 0.", f"{path}.{key}")
    return value


def _literal(value: Any, path: str) -> bytes:
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ResponseFormatError(f"Not a JSON value: {exc}.", path) from None
    raw = text.encode()
    if len(raw) > MAX_LITERAL_BYTES:
        raise ResponseFormatError(f"An enum option or const is over {MAX_LITERAL_BYTES} bytes as JSON.", path)
    return raw


def normalize(value: Any) -> tuple[dict | None, n.Node | None]:
    """The OpenAI-shaped dict (None for text) and the grammar's value node."""
    if value is None:
        return None, None
    if hasattr(value, "model_dump"):  # a pydantic model of the field (the wire layer's)
        value = value.model_dump(exclude_none=True, by_alias=True)
    if not isinstance(value, Mapping):
        raise ResponseFormatError("response_format must be an object such as {\"type\": \"json_object\"}.")
    kind = value.get("type")
    if kind == "text":
        if value.get("json_schema") is not None:
            raise ResponseFormatError("response_format.json_schema is only allowed with type 'json_schema'.",
                                      "response_format.json_schema")
        return None, None
    if kind == "json_object":
        if value.get("json_schema") is not None:
            raise ResponseFormatError("response_format.json_schema is only allowed with type 'json_schema'.",
                                      "response_format.json_schema")
        return {"type": "json_object"}, n.ANY_OBJECT
    if kind != "json_schema":
        raise ResponseFormatError(
            f"response_format type {kind!r} is not supported: use 'text', 'json_object' or 'json_schema'.",
            "response_format.type")
    spec = value.get("json_schema")
    if not isinstance(spec, Mapping):
        raise ResponseFormatError(
            "response_format type 'json_schema' needs a json_schema object: "
            "{\"name\": ..., \"schema\": {...}}.", "response_format.json_schema")
    if "schema" not in spec:
        raise ResponseFormatError("response_format.json_schema needs a 'schema'.",
                                  "response_format.json_schema.schema")
    name = spec.get("name", "response")
    if not isinstance(name, str):
        raise ResponseFormatError("response_format.json_schema.name must be a string.",
                                  "response_format.json_schema.name")
    schema = spec["schema"]
    try:
        size = len(json.dumps(schema, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ResponseFormatError(f"The schema is not JSON: {exc}.",
                                  "response_format.json_schema.schema") from None
    if size > MAX_SCHEMA_BYTES:
        raise ResponseFormatError(f"The schema is over {MAX_SCHEMA_BYTES} bytes as JSON.",
                                  "response_format.json_schema.schema")
    base = "response_format.json_schema.schema"
    node = _Compiler(schema, base).compile(schema, base)
    out: dict[str, Any] = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    for key in ("description", "strict"):
        if spec.get(key) is not None:
            out["json_schema"][key] = spec[key]
    return out, node
