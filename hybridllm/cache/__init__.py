"""The on-device semantic cache: ONNX embedder, exact index, SQLite store, learned hit verifier."""

from .embedder import Embedder, get_embedder

__all__ = ["Embedder", "get_embedder"]
