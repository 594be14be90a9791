"""A pydantic ValidationError as OpenAI's 400: one readable message, the field as ``param``."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ._sampling import FLOAT32_TINY
from .errors import WireError


def validation_error(exc: ValidationError) -> WireError:
    """The most useful pydantic error as one readable message, with the field as ``param``."""
    errors = exc.errors(include_url=False)
    if not errors:
        return WireError("Invalid request.")
    # An unknown field is the most useful thing to report (often a typo of a known one).
    # Else the deepest: for a union ("content": string or parts) it names the part that failed;
    # and one about the value before one saying it is of another union branch's type ("stop": a
    # list of 5 strings is too long, not "should be a valid string").
    extra = [e for e in errors if e.get("type") == "extra_forbidden"]
    first = extra[0] if extra else max(errors, key=lambda e: (
        len(e.get("loc", ())), not str(e.get("type", "")).endswith("_type")))
    param = _param(first.get("loc", ()))
    kind = first.get("type")
    if kind == "extra_forbidden":
        return WireError(f"Unrecognized request argument supplied: {param}", param=param)
    if kind == "missing":
        return WireError(f"Missing required parameter: '{param}'.", param=param)
    bound = _BOUNDS.get(str(kind))
    ctx = first.get("ctx") or {}
    if bound is not None and bound[1] in ctx:
        message = f"must {bound[0]} {ctx[bound[1]]!r}"  # repr: 1.1754943508222875e-38, not 0.00...
        if kind == "greater_than_equal" and ctx[bound[1]] == FLOAT32_TINY:  # top_p: 0 read as an odd floor
            message = f"must be > 0 (at least {FLOAT32_TINY!r}, the smallest normal float32)"
    else:
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    return WireError(f"Invalid value for '{param}': {message}.", param=param)


_BOUNDS = {
    "greater_than_equal": ("be >=", "ge"),
    "greater_than": ("be >", "gt"),
    "less_than_equal": ("be <=", "le"),
    "less_than": ("be <", "lt"),
    "too_long": ("have at most this many items:", "max_length"),
    "too_short": ("have at least this many items:", "min_length"),
}


def _param(loc: tuple[Any, ...]) -> str | None:
    """OpenAI's spelling of a location: ``messages[0].content``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_union_tag(part):
            out += f".{part}" if out else str(part)
    return out or None


def _is_union_tag(part: Any) -> bool:
    # pydantic adds the union member it tried ("str", "list[TextPart]") to the location; a
    # member with constraints is "constrained-str" (a legacy "prompt": null was named
    # 'prompt.constrained-str', no field of the request)
    return isinstance(part, str) and (
        "[" in part or part in {"str", "int", "float", "bool", "none"} or part.startswith("constrained-"))
