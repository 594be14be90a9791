"""Run an engine on a borrowed pool of a few blocks, to make preemptions happen in a test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cloud_server.engine.block_manager import BlockManager
from cloud_server.engine.scheduler import Scheduler


@contextlib.contextmanager
def small_pool(eng: Any, num_blocks: int, *, max_num_seqs: int = 16, max_num_batched_tokens: int = 512,
               watermark: float = 0.0) -> Iterator[Any]:
    """``eng`` on the first ``num_blocks`` blocks of its KV tensor, with a scheduler of its own.

    No admission watermark by default: a test that wants preemptions would be spared some by it
    (a newcomer waits instead of being admitted to be preempted). Afterwards the engine gets its
    own pool and scheduler back, and forgets the cached prefixes the borrowed blocks overwrote.
    """
    saved = eng.block_manager, eng.scheduler
    eng.block_manager = BlockManager(num_blocks, saved[0].block_size)
    eng.scheduler = Scheduler(eng.block_manager, max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens, watermark=watermark)
    try:
        yield eng
    finally:
        eng.block_manager, eng.scheduler = saved
        saved[0].reset_prefix_cache()
