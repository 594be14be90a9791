"""Prefix-cache chain hashes: a block's hash must tell its parents apart (review 14)."""

from __future__ import annotations

import os
import subprocess
import sys

from cloud_server.engine.block_manager import BlockManager, chain_hash
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.sequence import Sequence

_M61 = 2**61 - 1  # the modulus Python's hash takes ints by


def test_parents_equal_modulo_python_int_hash_give_different_children():
    """Python's tuple hash reduced the parent modulo 2**61 - 1: two different chains whose hashes
    differ by a multiple of it gave every following block one hash, so the second prefix's walk
    took KV computed for the first (the block's own tokens match; its parents are not compared)."""
    tokens = (5, 6, 7, 8)
    for parent in (chain_hash(None, (1, 2, 3, 4)), 12345, -987654321):
        other = parent + _M61 if parent + _M61 < 2**63 else parent - _M61
        assert chain_hash(parent, tokens) != chain_hash(other, tokens)


def test_chain_hash_is_64_bit_and_the_same_in_every_process():
    """The router compares its hashes with a replica's: no per-process salt, and a signed 64-bit
    int (as before) for the reports."""
    h = chain_hash(chain_hash(None, (1, 2, 3)), (4, 5, 6))
    assert -(2**63) <= h < 2**63
    code = "from cloud_server.engine.block_manager import chain_hash as c; print(c(c(None,(1,2,3)),(4,5,6)))"
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert int(out.stdout) == h


def test_prefix_hits_still_follow_the_chain():
    bm = BlockManager(8, 4)
    a = Sequence("a", [1, 2, 3, 4, 5, 6, 7, 8, 9], SamplingParams())
    bm.append_slots(a, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    bm.commit(a)
    same = Sequence("b", [1, 2, 3, 4, 5, 6, 7, 8, 10], SamplingParams())
    assert bm.allocate_prefix(same) == 8
    other_first = Sequence("c", [0, 2, 3, 4, 5, 6, 7, 8, 10], SamplingParams())
    assert bm.allocate_prefix(other_first) == 0
