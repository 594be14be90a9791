"""The on-device semantic cache: ONNX embedder, exact index, SQLite store, learned hit verifiers."""

from .embedder import Embedder, get_embedder
from .reranker import Reranker, RerankVerifier
from .semantic import CacheHit, SemanticCache
from .verifier import HitVerifier

__all__ = [
    "CacheHit",
    "Embedder",
    "HitVerifier",
    "RerankVerifier",
    "Reranker",
    "SemanticCache",
    "get_embedder",
]
