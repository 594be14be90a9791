"""The on-device semantic cache: ONNX embedder, exact index, SQLite store, learned hit verifier."""

from .embedder import Embedder, get_embedder
from .semantic import CacheHit, SemanticCache
from .verifier import HitVerifier

__all__ = ["CacheHit", "Embedder", "HitVerifier", "SemanticCache", "get_embedder"]
