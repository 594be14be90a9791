"""Rows read straight off the pages of a damaged SQLite file, without SQLite.

SQLite reaches a table's rows through its b-tree, from the root page down: with the root (or an
interior page) of the entries table damaged, no query reads a single row, although every leaf
page holding them is intact (a 300-entry cache damaged there lost all 300). The leaves name
themselves (their first byte), so they can be found by reading the file page by page. Only
pages SQLite counts in use are read: not the freelist, whose pages may hold deleted rows (the
cache zeroes them, ``secure_delete``, but a file written without it does not), and not a cell's
freed space. The file format: https://www.sqlite.org/fileformat2.html.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from pathlib import Path

_MAGIC = b"SQLite format 3\x00"
_TABLE_LEAF = 0x0D


class _Damaged(Exception):
    """A cell, record or overflow chain that does not parse: skipped, never guessed at."""


def table_leaf_rows(path: Path) -> Iterator[tuple[int, list[int], list]]:
    """(rowid, serial types, values) of every cell on every table leaf page of ``path`` not on
    its freelist. Text comes as bytes (the caller decodes it); nothing when the header, which
    gives the page size, is damaged."""
    with open(path, "rb") as f:
        if f.seek(0, 2) < 100:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield from _Pages(data).rows()


class _Pages:
    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        size = struct.unpack_from(">H", data, 16)[0]
        self.size = 65536 if size == 1 else size
        self.usable = self.size - data[20]
        self.count = len(data) // self.size if self.size else 0
        # the header's page count holds when it was written by a version that keeps it
        if data[24:28] == data[92:96] and (in_header := struct.unpack_from(">I", data, 28)[0]):
            self.count = min(self.count, in_header)

    def _valid(self) -> bool:
        # text in UTF-8 (1 at offset 56), as every cache is written: UTF-16 read as UTF-8 is garbage
        return (self.data[:16] == _MAGIC and 512 <= self.size <= 65536
                and self.size & (self.size - 1) == 0 and self.usable >= 480
                and struct.unpack_from(">I", self.data, 56)[0] == 1)

    def page(self, number: int) -> bytes:
        if not 1 <= number <= self.count:
            raise _Damaged(f"page {number} is outside the file")
        start = (number - 1) * self.size
        return self.data[start : start + self.size]

    def rows(self) -> Iterator[tuple[int, list[int], list]]:
        if not self._valid():
            return
        free = self._freelist()
        for number in range(2, self.count + 1):  # page 1 is the schema's
            if number in free:
                continue
            page = self.page(number)
            if page[0] != _TABLE_LEAF:
                continue
            cells = struct.unpack_from(">H", page, 3)[0]
            for i in range(cells):
                try:
                    yield self._cell(page, struct.unpack_from(">H", page, 8 + 2 * i)[0])
                except (_Damaged, struct.error, IndexError, ValueError):
                    continue

    def _freelist(self) -> set[int]:
        """The freelist's pages; a damaged list ends where it stops making sense."""
        free: set[int] = set()
        trunk = struct.unpack_from(">I", self.data, 32)[0]
        try:
            while trunk and trunk not in free:
                page = self.page(trunk)
                free.add(trunk)
                leaves = min(struct.unpack_from(">I", page, 4)[0], self.usable // 4 - 2)
                free.update(struct.unpack_from(f">{leaves}I", page, 8))
                trunk = struct.unpack_from(">I", page, 0)[0]
        except _Damaged:
            pass
        return free

    def _cell(self, page: bytes, at: int) -> tuple[int, list[int], list]:
        if not 8 <= at < self.usable:
            raise _Damaged("a cell pointer outside the page")
        size, at = _varint(page, at)
        rowid, at = _varint(page, at)
        if rowid >= 1 << 63:
            rowid -= 1 << 64
        payload = self._payload(page, at, size)
        types, values = _record(payload)
        return rowid, types, values

    def _payload(self, page: bytes, at: int, size: int) -> bytes:
        """The cell's payload, followed onto its overflow pages when it does not fit the page."""
        most = self.usable - 35
        if size <= most:
            local = size
        else:  # the split SQLite makes (fileformat2, "Cell Payload Overflow Pages")
            least = (self.usable - 12) * 32 // 255 - 23
            local = least + (size - least) % (self.usable - 4)
            local = local if local <= most else least
        if at + local > self.usable:
            raise _Damaged("a cell running off its page")
        parts, got = [page[at : at + local]], local
        if got < size:
            following = struct.unpack_from(">I", page, at + local)[0]
            seen: set[int] = set()
            while got < size:
                if following in seen:
                    raise _Damaged("an overflow chain that loops")
                seen.add(following)
                overflow = self.page(following)
                take = min(size - got, self.usable - 4)
                parts.append(overflow[4 : 4 + take])
                got += take
                following = struct.unpack_from(">I", overflow, 0)[0]
        return b"".join(parts)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = 0
    for i in range(8):
        byte = data[at + i]
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + i + 1
    return (value << 8) | data[at + 8], at + 9


_INT_SIZES = {1: 1, 2: 2, 3: 3, 4: 4, 5: 6, 6: 8}


def _record(payload: bytes) -> tuple[list[int], list]:
    """A record's serial types and values; text and blobs as bytes. Its parts must add up to
    exactly the payload: garbage almost never does."""
    header, at = _varint(payload, 0)
    if not 1 <= header <= len(payload):
        raise _Damaged("a record header longer than its record")
    types = []
    while at < header:
        kind, at = _varint(payload, at)
        types.append(kind)
    if at != header:
        raise _Damaged("a record header that overruns itself")
    values: list = []
    for kind in types:
        if kind in _INT_SIZES:
            n = _INT_SIZES[kind]
            values.append(int.from_bytes(payload[at : at + n], "big", signed=True))
        elif kind == 7:
            n = 8
            values.append(struct.unpack_from(">d", payload, at)[0])
        elif kind in (0, 8, 9):
            n = 0
            values.append(None if kind == 0 else kind - 8)
        elif kind >= 12:
            n = (kind - 12) // 2
            values.append(bytes(payload[at : at + n]))
        else:
            raise _Damaged(f"serial type {kind}")
        at += n
    if at != len(payload):
        raise _Damaged("a record whose values do not fill it")
    return types, values
