"""Decode steps replayed from CUDA graphs: one capture per (rows, context) bucket.

A decode step of a small model on a GPU is bound by the host, not the GPU: SmolLM2's eager step
launches about 1,100 kernels and takes ~17 ms on an H200 while the GPU is busy for ~3 ms of it.
A CUDA graph records the whole forward once and replays it with one launch.

A graph replays fixed shapes on fixed memory, so each decode-only step is padded to a bucket:
rows to a power of two (at least ``MIN_ROWS``), the key window to a power of two (at least
``MIN_CONTEXT``). Padded rows embed token 0 at position 0, write their key and value to the
runner's scratch slot (outside every block the block manager hands out) and attend to it alone;
padded key columns are masked as in the eager step. Steps with a prefill chunk, more rows than
the largest bucket or a window past ``max_context`` run eagerly.

``capture=False`` runs the same padded forward without a graph (CPU tests of the padding). A
capture that fails (out of GPU memory, an op that cannot be captured) is logged once and its
bucket runs eagerly from then on: the step itself never fails because of a graph.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from ..layers.attention import AttentionMetadata

logger = logging.getLogger(__name__)

MIN_ROWS = 8  # a plain step and a verify step of up to 8 rows share one GEMM shape
MIN_CONTEXT = 128
MAX_GATHERED_SLOTS = 1 << 18  # rows * context of the largest graph (keys gathered per layer)


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, 1 << (max(n, 1) - 1).bit_length())


@dataclass
class _Graph:
    rows: int
    context: int
    input_ids: torch.Tensor  # [rows]
    positions: torch.Tensor  # [rows]
    meta: AttentionMetadata  # slot_mapping [rows], decode_gather [rows, context], decode_lens [rows]
    out: torch.Tensor | None = None  # [rows, hidden], written by each replay
    graph: Any = None  # torch.cuda.CUDAGraph, or None when not captured


class DecodeGraphs:
    def __init__(self, model: Any, kv_cache: torch.Tensor, scratch_slot: int, *, max_rows: int,
                 max_context: int, capture: bool = True) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.scratch = scratch_slot
        self.max_rows = _pow2_at_least(max_rows, MIN_ROWS)
        self.max_context = _pow2_at_least(max_context, MIN_CONTEXT)
        self.capture = capture
        self.device = kv_cache.device
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._failed: set[tuple[int, int]] = set()  # buckets whose capture failed: eager
        self._pool: Any = None

    def bucket(self, rows: int, context: int) -> tuple[int, int] | None:
        """The (rows, context) shape a step runs at, or None when it runs eagerly."""
        b, c = _pow2_at_least(rows, MIN_ROWS), _pow2_at_least(context, MIN_CONTEXT)
        if b > self.max_rows or c > self.max_context or b * c > MAX_GATHERED_SLOTS:
            return None
        return b, c

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor | None:
        """Hidden states [T, hidden] of a decode-only step, or None to run it eagerly. The result
        is a view of the graph's output: read it before the next step."""
        if meta.prefills or meta.decode_gather is None or meta.decode_lens is None:
            return None
        n, width = meta.decode_gather.shape
        key = self.bucket(n, width)
        if key is None or key in self._failed:
            return None
        g = self._graphs.get(key)
        if g is None:
            try:
                g = self._make(*key)
            except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
                self._failed.add(key)
                logger.warning("CUDA graph capture for %d rows x %d keys failed (%s: %s); those "
                               "steps run eagerly", key[0], key[1], type(exc).__name__, exc)
                return None
        g.input_ids[:n].copy_(input_ids)
        g.input_ids[n:].zero_()
        g.positions[:n].copy_(positions)
        g.positions[n:].zero_()
        g.meta.slot_mapping[:n].copy_(meta.slot_mapping)
        g.meta.slot_mapping[n:].fill_(self.scratch)
        gather = g.meta.decode_gather
        assert gather is not None and g.meta.decode_lens is not None
        gather[:n, :width].copy_(meta.decode_gather)
        gather[:n, width:].fill_(self.scratch)
        gather[n:].fill_(self.scratch)
        g.meta.decode_lens[:n].copy_(meta.decode_lens)
        g.meta.decode_lens[n:].fill_(1)
        self._replay(g)
        assert g.out is not None
        return g.out[:n]

    def _run(self, g: _Graph) -> torch.Tensor:
        return self.model(g.input_ids, g.positions, self.kv_cache, g.meta)

    def _replay(self, g: _Graph) -> None:
        if g.graph is not None:
            g.graph.replay()
        else:  # the same static inputs with new contents: cached masks and RoPE rows are stale
            self._forget_step_caches(g)
            g.out = self._run(g)

    def _make(self, rows: int, context: int) -> _Graph:
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.full((rows,), self.scratch, dtype=torch.long, device=dev),
            num_decode=rows,
            decode_gather=torch.full((rows, context), self.scratch, dtype=torch.long, device=dev),
            decode_lens=torch.ones(rows, dtype=torch.long, device=dev),
        )
        g = _Graph(rows, context, torch.zeros(rows, dtype=torch.long, device=dev),
                   torch.zeros(rows, dtype=torch.long, device=dev), meta)
        if self.capture:
            self._capture(g)
        self._graphs[(rows, context)] = g
        return g

    def _forget_step_caches(self, g: _Graph) -> None:
        """Masks and RoPE rows are cached per step object; inside a capture they must be computed,
        not read from the warm-up run, or every replay would reuse the warm-up's values."""
        g.meta.forget_masks()
        for rope in getattr(self.model, "ropes", []):
            rope.forget_rows()

    def _capture(self, g: _Graph) -> None:
        # Warm up on a side stream (library handles, workspaces), then record one forward. Every
        # row of the static inputs is padding here, so these runs write the scratch slot only.
        with torch.cuda.device(self.device):  # the engine's GPU, whichever one is current
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._forget_step_caches(g)
                    self._run(g)
            torch.cuda.current_stream().wait_stream(stream)
            self._forget_step_caches(g)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                g.out = self._run(g)
        self._pool = graph.pool()
        g.graph = graph
        self._forget_step_caches(g)
