"""The engine's counters and read-only reports: stats, load report, start-up description, spec log."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from ..cpu_features import ISA_VARIABLE
from .block_manager import BlockManager
from .scheduler import Scheduler

logger = logging.getLogger("cloud_server.engine.llm_engine")  # the engine's log name, as before the split

_SPEC_LOG_SECONDS = 10.0


class EngineStatsMixin:
    """``LLMEngine``'s step and KV counters, its speculative-decoding log and its reports."""

    block_manager: BlockManager
    scheduler: Scheduler
    runner: Any
    spec: Any
    device: Any
    dtype: Any
    quantization: str
    _spec_logged: tuple[float, int]
    _steps: int
    _last_batch_num_seqs: int
    _last_batch_num_tokens: int
    _max_batch_num_seqs: int
    _peak_slots: int
    _unused_slots_at_peak: int

    def _log_spec(self) -> None:
        """Every ~10 s with new drafts: the mean acceptance length (1 + accepted per draft)."""
        now, st = time.monotonic(), self.spec.stats
        last_time, last_drafts = self._spec_logged
        if now - last_time < _SPEC_LOG_SECONDS or st.num_drafts == last_drafts:
            return
        self._spec_logged = (now, st.num_drafts)
        rate = st.num_accepted_tokens / max(1, st.num_draft_tokens)
        logger.info(
            "speculative decoding: mean acceptance length %.2f, acceptance rate %.1f%% "
            "(%d drafts, %d draft tokens, %d accepted)",
            st.mean_acceptance_length,
            100 * rate,
            st.num_drafts,
            st.num_draft_tokens,
            st.num_accepted_tokens,
        )

    # -- stats -------------------------------------------------------------------------------
    def _record_batch(self, num_seqs: int, num_tokens: int) -> None:
        self._steps += 1
        self._last_batch_num_seqs, self._last_batch_num_tokens = num_seqs, num_tokens
        self._max_batch_num_seqs = max(self._max_batch_num_seqs, num_seqs)

    def _record_kv(self) -> None:
        """Track allocated slots and, at their peak, how many hold no computed token."""
        bm = self.block_manager
        allocated = bm.num_used_blocks * bm.block_size
        if allocated >= self._peak_slots:
            self._peak_slots = allocated
            self._unused_slots_at_peak = sum(
                len(s.block_table) * bm.block_size - s.num_computed_tokens for s in self.scheduler.running
            )

    def describe(self) -> str:
        """Where and how the model runs, for the server's start-up log line."""
        dtype = str(self.dtype).removeprefix("torch.")
        parts = [f"{self.device}", dtype, f"quantization {self.quantization}"]
        if self.device.type == "cuda":
            parts.append("CUDA graphs " + ("on" if self.runner.graphs is not None else "off"))
        elif self.device.type == "cpu" and os.environ.get(ISA_VARIABLE):  # cpu_features.py: AMX kept off
            parts.append(f"oneDNN up to {os.environ[ISA_VARIABLE]}")
        if self.spec.method:
            parts.append(f"speculative {self.spec.method} k={self.spec.server_k}")
        return ", ".join(parts)

    def stats(self) -> dict[str, Any]:
        bm, sch = self.block_manager, self.scheduler
        return {
            "num_running": len(sch.running),
            "num_waiting": len(sch.waiting),
            "num_total_blocks": bm.num_blocks,
            "num_free_blocks": bm.num_free_blocks,
            "num_cached_blocks": bm.num_cached_blocks,
            "kv_cache_usage": bm.usage,
            "prefix_cache_queries": bm.prefix_cache_queries,
            "prefix_cache_hits": bm.prefix_cache_hits,
            "num_preemptions": sch.num_preemptions,
            "steps": self._steps,
            "last_batch_num_seqs": self._last_batch_num_seqs,
            "last_batch_num_tokens": self._last_batch_num_tokens,
            "max_batch_num_seqs": self._max_batch_num_seqs,
            "kv_peak_allocated_slots": self._peak_slots,
            "kv_unused_slots_at_peak": self._unused_slots_at_peak,
            # one consistent copy: the engine thread may be counting a draft meanwhile
            **self.spec.stats.snapshot(),
        }

    def load_report(self) -> dict[str, Any]:
        """Read-only load for a cluster router: outstanding tokens (tokens still to prefill, a
        preempted request's outputs included, + decode tokens still expected, up to
        ``max_tokens``) and the prefix block hashes held. Called from outside the engine
        thread: copies before it counts."""
        running, waiting = list(self.scheduler.running), list(self.scheduler.waiting)
        seqs = [*running, *waiting]
        # a preempted request recomputes its outputs too, all but the last (the decode row that
        # samples its next token), also once running again in chunks (it counted its prompt alone)
        prefill = sum(max(0, s.num_tokens - s.num_computed_tokens - (s.num_output_tokens > 0))
                      for s in seqs)
        decode = sum(max(0, s.params.max_tokens - s.num_output_tokens) for s in seqs)
        return {
            "outstanding_tokens": prefill + decode,
            "prefill_tokens": prefill,
            "decode_tokens": decode,
            "prefix_hashes": self.block_manager.cached_block_hashes(),
        }

    def reset_stats(self) -> None:
        self._steps = self._max_batch_num_seqs = 0
        self._peak_slots = self._unused_slots_at_peak = 0
        self.scheduler.num_preemptions = 0
        self.block_manager.prefix_cache_queries = self.block_manager.prefix_cache_hits = 0
        from .spec_decode import SpecStats

        self.spec.stats = SpecStats()
