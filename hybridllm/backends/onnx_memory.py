"""Huge pages for the loaded model: finding the memory the model load mapped and advising 2 MB pages on it."""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

_HUGE_PAGE = 2 << 20  # the PMD size of x86-64 and arm64 (4 kB base pages)
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25  # <sys/mman.h>; MADV_COLLAPSE since Linux 6.1


def _anon_regions() -> dict[tuple[int, int], tuple[int, bool]]:
    """This process's private writable anonymous mappings and its heap: (start, end) -> (Rss bytes,
    is the heap)."""
    regions: dict[tuple[int, int], tuple[int, bool]] = {}
    key: tuple[int, int] | None = None
    heap = False
    try:
        # the kernel's bytes as they are: a mapped file's non-ASCII path (a model folder under
        # /home/josé) failed the locale's codec (C, ASCII), and no memory was put on huge pages
        with open("/proc/self/smaps", encoding="utf-8", errors="replace") as smaps:
            for line in smaps:
                head = line.split()
                if "-" in head[0] and len(head) >= 5:  # a mapping's header line
                    name = head[5] if len(head) > 5 else ""
                    key, heap = None, name == "[heap]"
                    if head[1].startswith("rw") and head[1].endswith("p") and name in ("", "[heap]"):
                        lo, hi = (int(x, 16) for x in head[0].split("-"))
                        key = (lo, hi)
                elif key is not None and head[0] == "Rss:":
                    regions[key] = (int(head[1]) * 1024, heap)
    except (OSError, ValueError, IndexError):
        return {}
    return regions


def _resident_bytes(libc: Any, lo: int, hi: int) -> int:
    """Resident bytes of the page-aligned range [lo, hi) of this process (``mincore``; 0 if it
    fails)."""
    page = os.sysconf("SC_PAGE_SIZE")
    vec = (ctypes.c_ubyte * ((hi - lo + page - 1) // page))()
    mincore = libc.mincore
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    if mincore(lo, hi - lo, vec) != 0:
        return 0
    return sum(b & 1 for b in bytes(vec)) * page


def _new_parts(lo: int, hi: int, old: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[lo, hi) less the ``old`` ranges (sorted): the kernel merges a new mapping into an old one
    next to it with the same flags, so one mapping now can be part old memory, part new."""
    parts, at = [], lo
    for a, b in old:
        if b <= at or a >= hi:
            continue
        if a > at:
            parts.append((at, a))
        at = max(at, b)
    if at < hi:
        parts.append((at, hi))
    return parts


def _advise_huge_pages(before: dict[tuple[int, int], tuple[int, bool]]) -> int:
    """Put the mostly-filled anonymous memory mapped since ``before``, and the heap, on huge pages.
    (The heap always: a process that freed much memory before, as a build does, gets the model's
    weights put into the heap's free space, which changes no mapping.)

    ``madvise(MADV_HUGEPAGE)`` lets the kernel use 2 MB pages there where THP is in ``madvise`` mode
    (the usual default), and ``MADV_COLLAPSE`` moves what is already filled in now instead of
    waiting for khugepaged. Only ranges at least half resident are advised, so reserved but
    untouched space (thread stacks, an arena's tail) is not filled, and only the new part of a
    mapping the kernel merged with an old one (the old part may be another arena's reserve).
    Returns the bytes advised; 0 off Linux or where the kernel refuses (it is only a hint: nothing
    else changes).
    """
    if sys.platform != "linux":
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        return 0
    old = sorted(key for key, (_, heap) in before.items() if not heap)
    advised = 0
    for (lo, hi), (rss, heap) in _anon_regions().items():
        for a, b in [(lo, hi)] if heap else _new_parts(lo, hi, old):
            resident = rss if (a, b) == (lo, hi) else _resident_bytes(libc, a, b)
            if resident < (b - a) // 2:
                continue
            start = -(-a // _HUGE_PAGE) * _HUGE_PAGE  # the whole 2 MB pages inside [a, b)
            end = b // _HUGE_PAGE * _HUGE_PAGE
            if end - start < _HUGE_PAGE or madvise(start, end - start, _MADV_HUGEPAGE) != 0:
                continue
            madvise(start, end - start, _MADV_COLLAPSE)  # fails before Linux 6.1: khugepaged, later
            advised += end - start
    return advised
