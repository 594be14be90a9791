"""Whether the engine runs its own CPU kernels here, for tests whose numeric bounds were measured
with them.

The kernels need AVX-512 with VNNI. Without them (an AVX2-only CPU, macOS, ARM) the engine takes
torch's int4/int8 kernels: the same answers in kind, other rounding. Measured on an AMD EPYC with
AVX2 only (2026-12-02): SmolLM2 folder weights in int8 at logits cosine 0.967 to fp32 (0.99+ with
the kernels); a speculative step's logprobs 0.013 from the plain step's (under 0.002 with them);
one greedy answer of 40 tokens whose last token differed between plain and draft decoding.
"""

from __future__ import annotations


def engine_kernels() -> bool:
    from cloud_server.layers import cpu_kernels

    return cpu_kernels.int4_mm() is not None
