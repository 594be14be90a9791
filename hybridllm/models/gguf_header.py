"""A GGUF file's metadata read from its header alone (no weights, no vocabulary decoded).

Light (the standard library only): the device backend reads the trained context length before
llama.cpp makes a context, and the cloud server's start-up checks read the models' shapes, in
milliseconds where ``gguf.GGUFReader`` takes seconds (it reads the whole vocabulary).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# GGUF metadata value types (gguf's GGUFValueType): scalars' struct formats; 8 string, 9 array
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """A GGUF file's metadata (version 2 or 3), an array given as its length: the header only, so
    a start-up check costs milliseconds where ``GGUFReader`` takes seconds (it reads the whole
    vocabulary). ValueError (or struct.error, OSError) on a file that is not one or is damaged."""
    import mmap
    import struct

    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF" or struct.unpack_from("<I", buf, 4)[0] not in (2, 3):
            raise ValueError(f"{path} is not a GGUF file of version 2 or 3")
        pos = 24  # magic, version, tensor count, metadata count

        def string() -> str:
            nonlocal pos
            (n,) = struct.unpack_from("<Q", buf, pos)
            pos += 8 + n
            return buf[pos - n : pos].decode("utf-8", "replace")

        def value(kind: int) -> Any:
            nonlocal pos
            if kind == 8:
                return string()
            if kind == 9:
                item, n = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                if item in _GGUF_SCALARS:
                    pos += n * struct.calcsize(_GGUF_SCALARS[item])
                else:
                    for _ in range(n):
                        value(item)
                return n
            fmt = _GGUF_SCALARS[kind]  # KeyError: not a type of the format
            (v,) = struct.unpack_from(fmt, buf, pos)
            pos += struct.calcsize(fmt)
            return v

        meta: dict[str, Any] = {}
        try:
            for _ in range(struct.unpack_from("<Q", buf, 16)[0]):
                key = string()
                (kind,) = struct.unpack_from("<I", buf, pos)
                pos += 4
                meta[key] = value(kind)
        except (KeyError, RecursionError) as exc:  # a type no GGUF has; arrays nested past reason
            raise ValueError(f"{path} has damaged GGUF metadata ({type(exc).__name__})") from None
    return meta
