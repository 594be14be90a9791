"""The ONNX backend's huge-page advice on plain anonymous mappings (Linux with THP not "never")."""

from __future__ import annotations

import ctypes
import mmap
import sys
from pathlib import Path

import pytest

from hybridllm.backends.onnx_memory import _HUGE_PAGE, _advise_huge_pages, _anon_regions

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not THP.is_file() or "[madvise]" not in THP.read_text(),
    reason="transparent huge pages are Linux-only and in madvise mode here",
)
SIZE = 8 * _HUGE_PAGE
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # <sys/mman.h> on x86-64 and arm64
MAP_FIXED_NOREPLACE = 0x100000  # Linux 4.17
PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
_int = ctypes.c_int
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, _int, _int, _int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


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


def _vma(addr: int) -> dict[str, str]:
    """The smaps fields of the mapping that holds ``addr`` (with "range")."""
    fields: dict[str, str] = {}
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5:
            if fields:
                return fields
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            if lo <= addr < hi:
                fields["range"] = head[0]
        elif fields:
            fields[head[0].rstrip(":")] = " ".join(head[1:])
    if fields:
        return fields
    raise AssertionError("mapping not found")


def _resident_pages(addr: int, size: int) -> int:
    vec = (ctypes.c_ubyte * (size // PAGE))()
    assert libc.mincore(addr, size, vec) == 0
    return sum(b & 1 for b in bytes(vec))


def _advised(addr: int) -> bool:
    return "hg" in _vma(addr)["VmFlags"].split()


def _touch(addr: int, size: int, step: int) -> None:
    for at in range(0, size, step):
        ctypes.c_char.from_address(addr + at).value = b"\x01"


def test_old_and_untouched_mappings_are_left_alone():
    old, old_addr = _mapping(fill=True)
    before = _anon_regions()
    # reserved, one page in 512 resident (a collapse would fill the rest); MAP_NORESERVE keeps the
    # kernel from merging it with the old mapping next to it (it may merge with another reserve)
    empty, empty_addr = _mapping(fill=False, extra_flags=MAP_NORESERVE)
    for at in range(0, SIZE, _HUGE_PAGE):
        empty[at] = 1
    try:
        _advise_huge_pages(before)
        assert not _advised(old_addr) and _huge_bytes(old_addr) == 0
        assert _resident_pages(empty_addr, SIZE) == SIZE // _HUGE_PAGE  # not filled by a collapse
    finally:
        old.close()
        empty.close()


@pytest.fixture
def merged():
    """An old filled mapping and a new one the kernel merged into it: (old address, new address)."""
    base = libc.mmap(None, 2 * SIZE, 3, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert base not in (None, ctypes.c_void_p(-1).value)
    _touch(base, SIZE, PAGE)
    assert libc.munmap(base + SIZE, SIZE) == 0
    before = _anon_regions()
    # the freed half mapped again with the same flags: one mapping, half old and half new
    new = libc.mmap(base + SIZE, SIZE, 3, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0)
    try:
        if new != base + SIZE:
            pytest.skip("the freed range was taken meanwhile")
        lo, hi = (int(x, 16) for x in _vma(base)["range"].split("-"))
        if not lo <= base < base + 2 * SIZE <= hi:  # it may have merged a neighbour too
            pytest.skip("this kernel did not merge the two mappings")
        yield base, new, before
    finally:
        libc.munmap(base, 2 * SIZE)


def test_a_new_mapping_merged_into_an_old_one_advises_only_the_new_part(merged):
    old_addr, new_addr, before = merged
    _touch(new_addr, SIZE, PAGE)
    advised = _advise_huge_pages(before)
    assert advised >= SIZE - _HUGE_PAGE
    assert _advised(new_addr) and _advised(new_addr + SIZE - 1)
    assert not _advised(old_addr) and not _advised(new_addr - 1)


def test_a_sparse_new_mapping_merged_into_a_filled_old_one_is_left_alone(merged):
    # the old part makes the merged mapping more than half resident; the new part is not
    old_addr, new_addr, before = merged
    _touch(new_addr, SIZE, _HUGE_PAGE)
    _advise_huge_pages(before)
    assert not _advised(old_addr) and not _advised(new_addr)
    assert _resident_pages(new_addr, SIZE) == SIZE // _HUGE_PAGE
