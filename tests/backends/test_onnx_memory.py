"""The ONNX backend's huge-page advice on plain anonymous mappings (Linux with THP not "never")."""

from __future__ import annotations

import ctypes
import mmap
import sys
from pathlib import Path

import pytest

from hybridllm.backends.onnx import _HUGE_PAGE, _advise_huge_pages, _anon_regions

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not THP.is_file() or "[never]" in THP.read_text(),
    reason="transparent huge pages are Linux-only and on here",
)
SIZE = 8 * _HUGE_PAGE
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # <sys/mman.h> on x86-64 and arm64


def _mapping(fill: bool, extra_flags: int = 0) -> tuple[mmap.mmap, int]:
    buf = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | extra_flags)
    if fill:
        buf.write(b"\x01" * SIZE)  # resident, page by page
    return buf, ctypes.addressof(ctypes.c_char.from_buffer(buf))


def _huge_bytes(addr: int) -> int:
    """AnonHugePages of the mapping that holds ``addr``."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            inside = lo <= addr < hi
        elif inside and head[0] == "AnonHugePages:":
            return int(head[1]) * 1024
    raise AssertionError("mapping not found")


def test_a_filled_new_mapping_moves_onto_huge_pages():
    before = _anon_regions()
    buf, addr = _mapping(fill=True)
    try:
        assert _huge_bytes(addr) == 0  # madvise mode: nothing before the advice
        advised = _advise_huge_pages(before)
        assert advised >= SIZE - _HUGE_PAGE  # the whole 2 MB pages inside the mapping
        huge = _huge_bytes(addr)
        if huge == 0:
            pytest.skip("MADV_COLLAPSE not supported by this kernel (before Linux 6.1)")
        assert huge >= SIZE - 2 * _HUGE_PAGE
        assert buf[:1] == b"\x01" and buf[SIZE - 1 :] == b"\x01"  # contents unchanged
    finally:
        buf.close()


def test_old_and_untouched_mappings_are_left_alone():
    old, old_addr = _mapping(fill=True)
    before = _anon_regions()
    # reserved, one page in 512 resident (a collapse would fill the rest); MAP_NORESERVE keeps the
    # kernel from merging it with the old mapping next to it
    empty, empty_addr = _mapping(fill=False, extra_flags=MAP_NORESERVE)
    for at in range(0, SIZE, _HUGE_PAGE):
        empty[at] = 1
    try:
        _advise_huge_pages(before)
        assert _huge_bytes(old_addr) == 0
        assert _huge_bytes(empty_addr) == 0
    finally:
        old.close()
        empty.close()
