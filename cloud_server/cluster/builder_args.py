"""``app_builder``'s args typed as its fields say: ``serve run ...:app_builder replicas=2`` passes
every value as a string (a Serve config file's YAML passes typed values, kept as they are).

No Ray here: the rules are tested without it."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from ..config import ClusterConfig, EngineConfig

# the front end's own options (create_app) and the energy meter's, beside the two configs' fields
APP_TYPES: dict[str, Any] = {
    "served_model_name": str,
    "system_prompt": str,
    "api_keys": list,
    "max_body_bytes": int,
    "power_watts": float | None,
}
_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}
_WORDS = {bool: "true or false", int: "a whole number", float: "a number"}


def field_types() -> dict[str, Any]:
    """Every arg ``app_builder`` takes -> its type (``int | None`` and the like)."""
    out: dict[str, Any] = {}
    for cls in (EngineConfig, ClusterConfig):
        hints = typing.get_type_hints(cls)
        out.update({f.name: hints[f.name] for f in dataclasses.fields(cls)})
    return {**out, **APP_TYPES}


def typed_args(args: dict[str, Any]) -> dict[str, Any]:
    """``args`` with each string value turned into its field's type: "2" -> 2 for ``replicas``,
    "0.5" -> 0.5, "false" -> False, "none" -> None where None is allowed, "a,b" -> ["a", "b"] for
    ``api_keys``; a value that is no such thing is a ValueError naming the arg. Unknown args and
    values that are not strings are left to the caller's checks."""
    kinds = field_types()
    return {k: _typed(k, v, kinds[k]) if k in kinds and isinstance(v, str) else v for k, v in args.items()}


def _typed(name: str, value: str, kind: Any) -> Any:
    union = typing.get_origin(kind) in (typing.Union, types.UnionType)
    allowed = set(typing.get_args(kind)) if union else {kind}
    text = value.strip()
    if type(None) in allowed and text.lower() in ("", "none", "null"):
        return None
    if str in allowed:
        return value
    if list in allowed:  # api_keys: one key, or several joined by commas
        return [k.strip() for k in text.split(",") if k.strip()]
    try:
        if bool in allowed:
            if text.lower() in _TRUE | _FALSE:
                return text.lower() in _TRUE
            raise ValueError
        if int in allowed:
            return int(text)
        if float in allowed:
            return float(text)
    except ValueError:
        pass
    else:
        return value
    want = next(w for t, w in _WORDS.items() if t in allowed)
    raise ValueError(f"app_builder arg {name}={value!r} is not {want}")
