"""A GGUF file's metadata and tensor table read from its header alone (no weights decoded).

Light (the standard library only): the device backend reads the trained context length before
llama.cpp makes a context, the cloud server's start-up checks read the models' shapes, and the
cloud loader reads the tensor table, in milliseconds where ``gguf.GGUFReader`` takes seconds (it
parses every item of the vocabulary with numpy).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

# GGUF metadata value types (gguf's GGUFValueType): scalars' struct formats; 8 string, 9 array
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}
# the fewest bytes one item of a string (its length) or array (type and count) type takes
_MIN_ITEM_BYTES = {8: 8, 9: 12}
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, the smallest value
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8  # name length, dimension count, type, offset
_LENGTH = struct.Struct("<Q")
DEFAULT_ALIGNMENT = 32  # the format's, where general.alignment is not given
_T = TypeVar("_T")


@dataclass(frozen=True)
class GGUFTensorEntry:
    """One row of the tensor table."""

    name: str
    type_id: int  # ggml's tensor type (gguf's GGMLQuantizationType value)
    dims: tuple[int, ...]  # as stored: the contiguous dimension first
    data_offset: int  # from the file's start: the data section's (aligned) start plus its own
    n_elements: int


@dataclass
class GGUFHeader:
    """``metadata``: every key's value as ``GGUFReader``'s ``field.contents()`` gives it (arrays as
    flat lists, the ``GGUF.*`` counts first), but the arrays named in ``skip``, which are left out
    and have only their length in ``array_lengths``."""

    metadata: dict[str, Any]
    tensors: list[GGUFTensorEntry]
    alignment: int
    file_size: int
    array_lengths: dict[str, int] = field(default_factory=dict)


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    """A GGUF file's metadata (version 2 or 3), an array given as its length: the header only, so
    a start-up check costs milliseconds where ``GGUFReader`` takes seconds (it reads the whole
    vocabulary). ValueError naming the file (and, for damaged metadata, the offset) on a file that
    is not one or is damaged; OSError on one that cannot be read."""
    return _read(path, lambda cur: cur.metadata())


def read_gguf_header(path: str | Path, skip: Collection[str] = ()) -> GGUFHeader:
    """The metadata (values in full but the arrays named in ``skip``) and the tensor table, with
    the data offsets ``GGUFReader`` gives; errors as :func:`read_gguf_metadata`."""
    return _read(path, lambda cur: cur.header(frozenset(skip)))


def _read(path: str | Path, step: Callable[[_Cursor], _T]) -> _T:
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size == 0:  # mmap refuses an empty file, without its name
            raise ValueError(f"{path} is empty, not a GGUF file of version 2 or 3")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return step(_Cursor(buf, path))


class _Cursor:
    """Reads the header's fields in order. Every length and count is checked against the bytes
    left in the file before it is used, so a damaged one is a ValueError naming the offset: not
    OverflowError, struct.error, a value cut short at the end, nor a buffer of the length's size."""

    def __init__(self, buf: mmap.mmap, path: str | Path) -> None:
        self.buf, self.path, self.pos = buf, path, 0
        self.values = False  # arrays' items read (the header), or only their lengths
        self.skip: frozenset[str] = frozenset()  # arrays left at their lengths all the same
        self.lengths: dict[str, int] = {}  # those arrays' lengths
        self.alignment_type: int | None = None  # general.alignment's value type, if given

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
                at = self.pos
                key = self.string("key")
                if key in meta:  # GGUFReader and llama.cpp refuse a file that says a key twice
                    raise self.damaged(at, f"key {key!r} appears twice")
                at = self.pos
                (kind,) = self.unpack("<I", "value type")
                meta[key] = self.top_value(key, kind, at)
        except RecursionError:  # arrays nested past reason
            raise self.damaged(self.pos, "arrays nested too deep") from None
        return meta

    def header(self, skip: frozenset[str]) -> GGUFHeader:
        self.values, self.skip = True, skip
        kv = self.metadata()
        version, tensor_count, kv_count = struct.unpack_from("<IQQ", self.buf, 4)
        meta = {"GGUF.version": version, "GGUF.tensor_count": tensor_count, "GGUF.kv_count": kv_count}
        for key in self.lengths:
            del kv[key]
        meta.update(kv)
        alignment = self.alignment(kv)
        entries = self.tensor_table(tensor_count)
        start = -(-self.pos // alignment) * alignment  # the data section: aligned after the table
        tensors = [GGUFTensorEntry(name, kind, dims, start + offset, math.prod(dims))
                   for name, kind, dims, offset in entries]
        return GGUFHeader(meta, tensors, alignment, len(self.buf), self.lengths)

    def alignment(self, kv: dict[str, Any]) -> int:
        """general.alignment: a uint32 power of two (as GGUFReader requires), else the default."""
        value = kv.get("general.alignment", DEFAULT_ALIGNMENT)
        if self.alignment_type not in (None, 4) or value <= 0 or value & (value - 1):
            raise ValueError(f"{self.path} has a bad general.alignment {value!r}: not a uint32 "
                             "power of two")
        return int(value)

    def tensor_table(self, count: int) -> list[tuple[str, int, tuple[int, ...], int]]:
        self.fits(count, _MIN_TENSOR_BYTES, 8, "tensor count")
        entries, names = [], set()
        for _ in range(count):
            at = self.pos
            name = self.string("tensor name")
            if name in names:
                raise self.damaged(at, f"tensor {name!r} appears twice")
            names.add(name)
            at = self.pos
            (n_dims,) = self.unpack("<I", "dimension count")
            self.fits(n_dims, 8, at, "dimension count")
            dims = self.unpack(f"<{n_dims}Q", f"tensor {name}'s dimensions")
            kind, offset = self.unpack("<IQ", f"tensor {name}'s type and offset")
            entries.append((name, kind, dims, offset))
        return entries

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

    def top_value(self, key: str, kind: int, at: int) -> Any:
        """A key's value: arrays in full when reading values, but for the keys skipped."""
        if key == "general.alignment":
            self.alignment_type = kind
        if kind != 9 or not self.values:
            return self.value(kind, at)
        if key in self.skip:
            self.lengths[key] = self.array()
            return None
        return self.array_values()

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
        if item == 8:
            self.strings(n, keep=False)
            return int(n)
        for _ in range(n):
            self.value(item, at)
        return int(n)

    def array_values(self) -> list[Any]:
        """An array's items as a list; nested arrays flattened, as ``field.contents()`` gives."""
        at = self.pos
        item, n = self.unpack("<IQ", "array header")
        fmt = _GGUF_SCALARS.get(item)
        if fmt is not None:
            start = self.take(n * struct.calcsize(fmt), f"array of {n} items", at)
            return list(struct.unpack_from(f"<{n}{fmt[1]}", self.buf, start))
        self.fits(n, _MIN_ITEM_BYTES.get(item, 1), at, "array length")
        if item == 8:
            return self.strings(n, keep=True)
        if item == 9:
            return [v for _ in range(n) for v in self.array_values()]
        if n:  # an empty array of an unknown type is read past, as GGUFReader does
            raise self.damaged(at, f"value type {item} is not a type of the format")
        return []

    def strings(self, n: int, keep: bool) -> list[str]:
        """n strings in a row, in one tight loop (a vocabulary holds 150k); a damaged one is read
        again by :meth:`string`, whose error names it."""
        buf, pos, end, out = self.buf, self.pos, len(self.buf), []
        length = _LENGTH.unpack_from
        for _ in range(n):
            start = pos + 8
            stop = start + length(buf, pos)[0] if start <= end else end + 1
            if stop > end:
                self.pos = pos
                self.string()  # raises, naming the offset
            if keep:
                out.append(buf[start:stop].decode("utf-8", "replace"))
            pos = stop
        self.pos = pos
        return out
