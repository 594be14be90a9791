"""What the CPU can do (``/proc/cpuinfo`` flags), and the one oneDNN setting the engine needs from it.

The engine's CPU attention runs bf16 matmuls through torch, which hands them to oneDNN. On a CPU
with AMX (Intel Sapphire Rapids and later: ``amx_bf16``) a big product runs on AMX tiles and a small
one (a decode step's few rows) on other kernels, which add the same products in another order:
a row's bf16 result then changes, now and then in its last bit, with the number of rows it is
computed with (2-core Xeon, torch 2.13, [600, 300] x [300, 64]: 6 of
600 rows differ from the same row alone). The engine rests on the opposite: a request batched with
others, prefilled after a prefix hit or verified with drafts gives bit for bit the tokens and
log-probabilities it gives alone (``layers/attention.py``). So where the CPU has AMX and
``ONEDNN_MAX_CPU_ISA`` is not set, ``cap_onednn_isa`` sets it to ``AVX512_CORE_BF16`` (AVX-512 BF16
for every size, as on a CPU without AMX) when ``cloud_server`` is imported. oneDNN reads the
variable on its first bf16 matmul, so the cap holds in any process that imports ``cloud_server``
before it runs one (the server, its replicas, the benchmarks, the tests); later, it is not applied
and ``onednn_cap_state`` says so (the engine then checks, ``bf16_rows_invariant``, and warns). A
value set by the user is kept: ``ONEDNN_MAX_CPU_ISA=ALL`` gives oneDNN its AMX kernels back
(faster prefill attention, a batched row no longer bit for bit alone). Nothing here imports
torch at import time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping, Set
from functools import cache

ISA_VARIABLE = "ONEDNN_MAX_CPU_ISA"
CAPPED_ISA = "AVX512_CORE_BF16"  # oneDNN's level below AMX: AVX-512 with the BF16 instructions


@cache
def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first ``flags`` line of ``/proc/cpuinfo`` as a set; empty where there is none (read once:
    the import's cap and the kernels' check both ask)."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def onednn_cap(flags: Set[str], env: Mapping[str, str]) -> str | None:
    """The ``ONEDNN_MAX_CPU_ISA`` value to set for CPU ``flags`` under ``env``, or None to leave it:
    a CPU with AMX and BF16 (``amx_bf16``, ``avx512_bf16``) and no value given by the user."""
    if ISA_VARIABLE in env:
        return None
    return CAPPED_ISA if {"amx_bf16", "avx512_bf16"} <= flags else None


_state = "not applied"


def cap_onednn_isa(env: MutableMapping[str, str] | None = None, flags: Set[str] | None = None) -> str:
    """Set the cap where ``onednn_cap`` says so, and return (and remember) what was done: ``"capped"``;
    ``"late"`` (capped, but torch was imported first, so a bf16 matmul may already have run
    uncapped); ``"user"`` (the user's own value kept); ``"not needed"`` (no AMX, or not Linux)."""
    global _state
    env = os.environ if env is None else env
    if ISA_VARIABLE in env:
        _state = "user"
    elif sys.platform != "linux":
        _state = "not needed"
    else:
        value = onednn_cap(cpu_flags() if flags is None else flags, env)
        if value is None:
            _state = "not needed"
        else:
            env[ISA_VARIABLE] = value
            _state = "late" if "torch" in sys.modules else "capped"
    return _state


def onednn_cap_state() -> str:
    """What ``cap_onednn_isa`` did when ``cloud_server`` was imported (see there)."""
    return _state


def bf16_rows_invariant() -> bool:
    """Whether torch's bf16 matmul on this CPU, as set up now, gives each row of a prefill-sized
    attention product ([3, 600, 300] x [300, 64]) exactly as the same row computed alone (seeded
    data: uncapped AMX changes 6 of the 600 rows on a 2-core Xeon; 60 ms)."""
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 1, 600, 300, generator=g).bfloat16()
    b = torch.randn(3, 1, 300, 64, generator=g).bfloat16()
    alone = torch.matmul(a.reshape(3, 600, 1, 300), b).reshape(3, 1, 600, 64)  # 1,800 one-row products
    return torch.equal(alone, torch.matmul(a, b))
