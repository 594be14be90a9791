"""The numbers hybridllm writes as JSON (the proxy's answers, the CLI's JSON output), made valid."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity (in dicts and lists too) made None: JSON has no such
    number. A custom router's NaN score or a custom cloud's NaN cost or energy made a finished
    answer a 500 (``JSONResponse`` refuses them) and a stream's last chunk a bare ``NaN`` that no
    client but Python's can parse (so did ``ask --json``); null is "not known", as an absent score is."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def finite_json(value: Any, **options: Any) -> str:
    """``value`` as JSON text for the CLI's output (``ask --json``, ``config show``, ``models list
    --json``, the router commands' summaries), each NaN or infinity null (:func:`_finite`).
    ``allow_nan=False``: a non-finite number that slips past it is a ValueError here, never a bare
    ``NaN`` or ``Infinity`` in the output that strict JSON parsers refuse."""
    return json.dumps(_finite(value), allow_nan=False, **options)
