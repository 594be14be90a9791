"""Embedded model catalog and the on-disk model store."""

from .catalog import ModelSpec, get_spec, load_catalog
from .remove import RemoveIncompleteError, disk_usage, remove
from .store import is_materialized, model_dir, pull, resolve_gguf, sha256_file, verify

__all__ = [
    "ModelSpec",
    "RemoveIncompleteError",
    "disk_usage",
    "get_spec",
    "is_materialized",
    "load_catalog",
    "model_dir",
    "pull",
    "remove",
    "resolve_gguf",
    "sha256_file",
    "verify",
]
