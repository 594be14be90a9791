"""The cloud engine's converted weights of a pulled model, as the model store sees them (no torch).

The engine keeps each GGUF it converted to int8 or int4 in ``<data dir>/engine-weights/`` as a
safetensors file whose header records the GGUF it came from (``cloud_server.models.weight_cache``
writes them). Such a file is as large as the converted model (about 1.6 GB for the 1.5B at int8),
so it belongs to its model: `hybridllm models list` counts it and `hybridllm models remove` deletes
it. The header is read here without torch, so the light client can measure and remove them.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from pathlib import Path
from typing import IO, Any

from .._paths import data_dir

FOLDER = "engine-weights"
FORMAT = "hybridllm-engine-weights"


# far past the header of any model's tensors (the 1.5B's is under 100 kB): a damaged length is
# refused instead of read, which for a 1.6 GB file was the whole file, at every `models list`
MAX_HEADER_BYTES = 100 << 20


def read_header(fh: IO[bytes], size: int) -> dict[str, Any]:
    """A safetensors file's JSON header (``fh`` at its start; ``size``: the file's bytes)."""
    (n,) = struct.unpack("<Q", fh.read(8))
    if n > min(size - 8, MAX_HEADER_BYTES):
        raise ValueError(f"header of {n} bytes in a {size}-byte file")
    header = json.loads(fh.read(n))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    return header


def read_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file's header, without reading any tensor."""
    with open(path, "rb") as fh:
        meta = read_header(fh, os.fstat(fh.fileno()).st_size).get("__metadata__")
    return meta if isinstance(meta, dict) else {}


def converted_from(folder: Path) -> list[Path]:
    """The engine's converted weights of a GGUF inside ``folder`` (a model's folder), by the source
    their headers record. A file that cannot be read, or of another format, is not claimed."""
    root = data_dir() / FOLDER
    inside = os.path.realpath(folder)
    found = []
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries:
            if not entry.name.endswith(".safetensors") or not entry.is_file(follow_symlinks=False):
                continue
            try:
                meta = read_metadata(Path(entry.path))
            except (OSError, ValueError, struct.error):
                continue
            source = meta.get("source")
            mine = isinstance(source, str) and source.startswith(inside + os.sep)
            if meta.get("format") == FORMAT and mine:
                found.append(Path(entry.path))
    return sorted(found)
