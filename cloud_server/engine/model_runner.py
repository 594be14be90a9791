"""Run one scheduled step on the model: flatten tokens, build paged-attention metadata, sample.

Owns the KV pool ``[num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim]``,
preallocated once. Decode tokens (one per sequence) go first in the flattened batch, then
prefill chunks; only the last token of a sequence that reaches its end is turned into logits.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..layers.attention import AttentionMetadata, PrefillSpan
from ..layers.sampler import Sampler
from ..models.config import ModelConfig
from .scheduler import ScheduledSeq


class ModelRunner:
    def __init__(
        self,
        model: nn.Module,
        config: ModelConfig,
        *,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        dtype: torch.dtype,
        seed: int = 0,
    ) -> None:
        self.model: Any = model  # a models.llama.CausalLM
        self.config = config
        self.block_size = block_size
        self.device = device
        self.kv_cache = torch.zeros(
            config.num_layers, 2, num_blocks * block_size, config.num_kv_heads, config.head_dim,
            device=device, dtype=dtype,
        )  # [L, 2, num_slots, KVH, D]
        self.sampler = Sampler(seed)

    def _slots(self, block_table: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [block_table[p // bs] * bs + p % bs for p in range(start, end)]

    def prepare(
        self, scheduled: list[ScheduledSeq]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[ScheduledSeq]]:
        """Returns (input_ids [T], positions [T], metadata, batch in flattened order)."""
        decode = [s for s in scheduled if s.num_new_tokens == 1]
        prefill = [s for s in scheduled if s.num_new_tokens > 1]
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        dev = self.device
        meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long))
        if decode:
            lens = [s.seq.num_computed_tokens + 1 for s in decode]
            max_len = max(lens)
            gather = []
            for s, n in zip(decode, lens, strict=True):
                c = s.seq.num_computed_tokens
                ids.append(s.seq.token_ids[c])
                pos.append(c)
                ctx_slots = self._slots(s.seq.block_table, 0, n)
                slots.append(ctx_slots[-1])
                gather.append(ctx_slots + [0] * (max_len - n))
            meta.num_decode = len(decode)
            meta.decode_gather = torch.tensor(gather, dtype=torch.long, device=dev)  # [B, L]
            meta.decode_lens = torch.tensor(lens, dtype=torch.long, device=dev)  # [B]
        for s in prefill:
            c, n = s.seq.num_computed_tokens, s.num_new_tokens
            start = len(ids)
            ids.extend(s.seq.token_ids[c : c + n])
            pos.extend(range(c, c + n))
            ctx_slots = self._slots(s.seq.block_table, 0, c + n)
            slots.extend(ctx_slots[c:])
            gather_t = torch.tensor(ctx_slots, dtype=torch.long, device=dev)  # [c + n]
            meta.prefills.append(PrefillSpan(start, start + n, gather_t, c))
        meta.slot_mapping = torch.tensor(slots, dtype=torch.long, device=dev)  # [T]
        input_ids = torch.tensor(ids, dtype=torch.long, device=dev)  # [T]
        positions = torch.tensor(pos, dtype=torch.long, device=dev)  # [T]
        return input_ids, positions, meta, decode + prefill

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSeq]) -> dict[int, int]:
        """Run the step; returns {seq_id: sampled token} for sequences that reached their end."""
        if not scheduled:
            return {}
        input_ids, positions, meta, order = self.prepare(scheduled)
        hidden = self.model(input_ids, positions, self.kv_cache, meta)  # [T, hidden]
        rows, sampling = [], []
        offset = 0
        for s in order:
            offset += s.num_new_tokens
            if s.samples:
                rows.append(offset - 1)
                sampling.append(s)
        if not sampling:
            return {}
        logits = self.model.compute_logits(hidden[rows])  # [N, vocab]
        tokens = self.sampler(
            logits, [s.seq.seq_id for s in sampling], [s.seq.params for s in sampling]
        )
        return {s.seq.seq_id: t for s, t in zip(sampling, tokens, strict=True)}

    @torch.inference_mode()
    def prompt_logits(self, scheduled: ScheduledSeq) -> torch.Tensor:
        """Logits at every position of one prefill chunk: [n, vocab] (parity tests)."""
        input_ids, positions, meta, _ = self.prepare([scheduled])
        hidden = self.model(input_ids, positions, self.kv_cache, meta)
        return self.model.compute_logits(hidden)

    def release(self, seq_id: int) -> None:
        self.sampler.release(seq_id)
