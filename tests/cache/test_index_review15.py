"""Review 15 of the cache index: memory of one-entry buckets."""

from __future__ import annotations

import tracemalloc

import numpy as np

from hybridllm.cache.index import BucketIndex


def test_one_entry_buckets_do_not_reserve_64_rows_each() -> None:
    """Each turn of a conversation is its own bucket, so most buckets hold one entry. Before,
    each reserved 64 rows of 384 floats (98 KB for a 1.5 KB vector): 1,000 such entries took
    98 MB, 10,000 (the default max_entries) about 1 GB. Now about 2 KB each."""
    vec = np.full(384, 1 / np.sqrt(384), dtype=np.float32)
    index = BucketIndex(384)
    tracemalloc.start()
    try:
        for i in range(1000):
            index.add(f"bucket {i}", f"entry {i}", vec)
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert used < 10_000_000
    # and a bucket still grows past its first row
    for i in range(100):
        index.add("big", f"row {i}", vec)
    assert index.bucket_size("big") == 100
    assert [eid for eid, _ in index.search("big", vec, 3)] and len(index.search("big", vec, 200)) == 100
