"""A GGUF file's metadata read from its header alone (no weights, no vocabulary decoded).

Light (the standard library only): the device backend reads the trained context length before
llama.cpp makes a context, and the cloud server's start-up checks read the models' shapes, in
milliseconds where ``gguf.GGUFReader`` takes seconds (it reads the whole vocabulary).
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

# GGUF metadata value types (gguf's GGUFValueType): scalars' struct formats; 8 string, 9 array
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}
# the fewest bytes one item of a string (its length) or array (type and count) type takes
_MIN_ITEM_BYTES = {8: 8, 9: 12}
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, the smallest value


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """A GGUF file's metadata (version 2 or 3), an array given as its length: the header only, so
    a start-up check costs milliseconds where ``GGUFReader`` takes seconds (it reads the whole
    vocabulary). ValueError naming the file (and, for damaged metadata, the offset) on a file that
    is not one or is damaged; OSError on one that cannot be read."""
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:  # mmap refuses an empty file, without its name
            raise ValueError(f"{path} is empty, not a GGUF file of version 2 or 3")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _Cursor(buf, path).metadata()


class _Cursor:
    """Reads the header's fields in order. Every length and count is checked against the bytes
    left in the file before it is used, so a damaged one is a ValueError naming the offset: not
    OverflowError, struct.error, a value cut short at the end, nor a buffer of the length's size."""

    def __init__(self, buf: mmap.mmap, path: str | Path) -> None:
        self.buf, self.path, self.pos = buf, path, 0

    def metadata(self) -> dict[str, Any]:
        buf = self.buf
        if buf[:4] != b"GGUF" or len(buf) < 8 or struct.unpack_from("<I", buf, 4)[0] not in (2, 3):
            raise ValueError(f"{self.path} is not a GGUF file of version 2 or 3")
        self.pos = 8  # past the magic and the version
        self.unpack("<Q", "tensor count")
        (count,) = self.unpack("<Q", "metadata count")
        self.fits(count, _MIN_KV_BYTES, 16, "metadata count")
        meta: dict[str, Any] = {}
        try:
            for _ in range(count):
                key = self.string("key")
                at = self.pos
                (kind,) = self.unpack("<I", "value type")
                meta[key] = self.value(kind, at)
        except RecursionError:  # arrays nested past reason
            raise self.damaged(self.pos, "arrays nested too deep") from None
        return meta

    def damaged(self, at: int, why: str) -> ValueError:
        return ValueError(f"{self.path} has damaged GGUF metadata at offset {at}: {why}")

    def take(self, n: int, what: str, at: int | None = None) -> int:
        """Step over the n bytes of ``what`` (its length read at offset ``at``); returns where
        they start."""
        start, left = self.pos, len(self.buf) - self.pos
        if n > left:
            raise self.damaged(start if at is None else at,
                               f"{what} ({n} bytes) runs past the end of the file ({left} bytes left)")
        self.pos += n
        return start

    def fits(self, count: int, item_bytes: int, at: int, what: str) -> None:
        """Refuse a count of items of at least ``item_bytes`` each that the rest cannot hold."""
        left = len(self.buf) - self.pos
        if count * item_bytes > left:
            raise self.damaged(at, f"{what} {count} is more than the {left} bytes left can hold")

    def unpack(self, fmt: str, what: str) -> tuple[Any, ...]:
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt), what))

    def string(self, what: str = "string") -> str:
        at = self.pos
        (n,) = self.unpack("<Q", f"{what} length")
        start = self.take(n, what, at)
        return self.buf[start : self.pos].decode("utf-8", "replace")

    def value(self, kind: int, at: int) -> Any:
        """A value of type ``kind``, whose type field is at offset ``at``."""
        if kind == 8:
            return self.string()
        if kind == 9:
            return self.array()
        fmt = _GGUF_SCALARS.get(kind)
        if fmt is None:
            raise self.damaged(at, f"value type {kind} is not a type of the format")
        return self.unpack(fmt, "value")[0]

    def array(self) -> int:
        """Steps over an array's items; its length is the value."""
        at = self.pos
        item, n = self.unpack("<IQ", "array header")
        fmt = _GGUF_SCALARS.get(item)
        if fmt is not None:
            self.take(n * struct.calcsize(fmt), f"array of {n} items", at)  # skipped, not read
            return int(n)
        self.fits(n, _MIN_ITEM_BYTES.get(item, 1), at, "array length")
        for _ in range(n):
            self.value(item, at)
        return int(n)
