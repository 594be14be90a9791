"""The on-device semantic cache: ONNX embedder, exact index, SQLite store, learned hit verifiers.

The names below are imported on first use (PEP 562): importing ``hybridllm`` or one submodule of
the cache loads neither numpy nor sqlite3 nor ONNX Runtime until a cache is built.
"""

from __future__ import annotations

import typing as _typing

if _typing.TYPE_CHECKING:
    from .embedder import Embedder, get_embedder
    from .reranker import Reranker, RerankVerifier
    from .semantic import CacheHit, SemanticCache
    from .verifier import HitVerifier

# public name -> the submodule that defines it
_LAZY = {
    "CacheHit": "semantic",
    "Embedder": "embedder",
    "HitVerifier": "verifier",
    "RerankVerifier": "reranker",
    "Reranker": "reranker",
    "SemanticCache": "semantic",
    "get_embedder": "embedder",
}

__all__ = [
    "CacheHit",
    "Embedder",
    "HitVerifier",
    "RerankVerifier",
    "Reranker",
    "SemanticCache",
    "get_embedder",
]


def __getattr__(name: str) -> _typing.Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
