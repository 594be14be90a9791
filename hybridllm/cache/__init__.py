"""The on-device semantic cache: ONNX embedder, exact index, SQLite store, learned hit verifiers.

The names below are imported on first use (PEP 562): importing ``hybridllm`` or one submodule of
the cache loads neither numpy nor sqlite3 nor ONNX Runtime until a cache is built.
"""

from __future__ import annotations

import typing as _typing

from .._lazy import lazy_names as _lazy_names

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


__getattr__, __dir__ = _lazy_names(__name__, globals(), _LAZY, __all__)
