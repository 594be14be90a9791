"""The engine's own CPU kernels (``cpu_kernels.cpp``: weight-only int4 and int8 matmuls whose
activations are rounded to int8 per row and group of 32, with integer dot products, so that their
cost stays nearly flat from one to eight rows): built on first use with the system's C++ compiler
against the installed torch, kept in ``<cache dir>/kernels/``, and loaded as torch ops.

Used where they pay: an x86-64 CPU with AVX-512 VNNI (AMD Zen 4 and later, Intel Cascade Lake, Ice
Lake, Sapphire Rapids and later). Anywhere else, or without a compiler, or with
``HYBRIDLLM_CPU_KERNELS=0``, the engine uses torch's own kernels; a failed build is logged once
with its reason, never raised. A damaged library file in the cache is built again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import torch

from hybridllm._files import remove_leftovers, replacing
from hybridllm._locks import lock_exclusive

from ..cpu_features import cpu_flags

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("cpu_kernels.cpp")
_FLAGS = ["-O3", "-std=c++20", "-shared", "-fPIC", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl",
          "-mavx512vnni", "-w"]
_NEEDED_CPU_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
# the temporaries of _files.replacing for any cpu_kernels.KEY.so (pid last), .NAME.*.tmp
_LEFTOVER = re.compile(r"\.cpu_kernels\..*\.so\..*\.tmp", re.DOTALL)


def _enabled_by_env() -> bool:
    return os.environ.get("HYBRIDLLM_CPU_KERNELS", "1").strip().lower() not in ("0", "false", "no", "off")


def _build(out: Path) -> None:
    """Compile the kernel into ``out`` (atomically: a concurrent build never sees half a file)."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        raise RuntimeError("no C++ compiler (g++) on PATH")
    torch_dir = Path(torch.__file__).parent
    out.parent.mkdir(parents=True, exist_ok=True)
    # One build at a time in the folder (.build.lock): a process that waited finds the library
    # built, and the one holding the lock removes what builds killed mid-way (SIGKILL, the OOM
    # killer: no ``finally`` ran) left, which were never loaded but stayed forever.
    with open(out.parent / ".build.lock", "w") as lock:
        if lock_exclusive(lock.fileno()):
            if out.is_file():
                return
            remove_leftovers(out.parent, _LEFTOVER)
        _compile(compiler, torch_dir, out)


def _compile(compiler: str, torch_dir: Path, out: Path) -> None:
    # compiled under a temporary name, fsynced and renamed into place; removed on any error
    with replacing(out) as tmp:
        cmd = [compiler, *_FLAGS, f"-I{torch_dir / 'include'}",
               f"-I{torch_dir / 'include' / 'torch' / 'csrc' / 'api' / 'include'}", str(_SOURCE),
               f"-L{torch_dir / 'lib'}", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{torch_dir / 'lib'}",
               "-o", str(tmp)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(compiler).name} failed: {done.stderr.strip()[-800:]}")


def _registered() -> bool:
    try:
        torch.ops.hybridllm_cpu.int4_mm  # noqa: B018 - raises where the library is not loaded
    except (AttributeError, RuntimeError):
        return False
    return True


_LOCK = threading.Lock()  # one build and one registration per process, whichever thread asks first


@cache
def _ops() -> Any | None:
    """The loaded ops (``torch.ops.hybridllm_cpu``), or None where they are not used."""
    with _LOCK:
        return _load()


def _load() -> Any | None:
    if not _enabled_by_env():
        return None
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    if not _NEEDED_CPU_FLAGS <= cpu_flags():
        return None
    try:
        from hybridllm._paths import cache_dir

        source = _SOURCE.read_bytes()
        ident = source + torch.__version__.encode() + " ".join(_FLAGS).encode()
        key = hashlib.sha256(ident).hexdigest()[:16]
        lib = cache_dir() / "kernels" / f"cpu_kernels.{key}.so"
        if not lib.is_file():
            logger.info("building the engine's CPU kernels into %s", lib)
            _build(lib)
        if not _registered():  # a second registration of the same ops aborts the process
            try:
                torch.ops.load_library(str(lib))
            except OSError as exc:  # a damaged file in the cache: build it again, once
                logger.warning("rebuilding the engine's CPU kernels (%s could not be loaded: %s)", lib, exc)
                lib.unlink(missing_ok=True)
                _build(lib)
                torch.ops.load_library(str(lib))
        return torch.ops.hybridllm_cpu
    except Exception as exc:  # noqa: BLE001 - any failure means torch's own kernels, said once
        logger.warning("the engine's CPU kernels are not used (torch's int4 and int8 kernels instead): %s",
                       exc)
        return None


@cache
def int4_mm() -> Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] | None:
    """``int4_mm(x bf16 [M, K], packed uint8 (``linear.pack_int4_blocks``), N) -> fp32 [M, N]``, or None
    where the kernels are not used."""
    ops = _ops()
    return None if ops is None else ops.int4_mm


@cache
def int8_mm() -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """``int8_mm(x bf16 [M, K], packed uint8 (``linear.pack_int8_blocks``), packed fp16 scales and zeros
    (``linear.pack_int8_scales``)) -> fp32 [M, N]``,
    or None where the kernels are not used."""
    ops = _ops()
    return None if ops is None else ops.int8_mm


def reset() -> None:
    """Forget what was decided (tests, benchmarks): the next call decides again, from the
    environment. Ops already loaded stay registered in this process."""
    for f in (_ops, int4_mm, int8_mm):
        f.cache_clear()
