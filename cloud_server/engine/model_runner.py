"""Run one scheduled step on the model: flatten tokens, build paged-attention metadata, sample.

Owns the KV pool ``[num_layers, 2, num_kv_heads, num_blocks * block_size, head_dim]``,
preallocated once. Decode rows go first in the flattened batch (one per decoding sequence, or
one per position of a token with lookaheads: each attends to its own context length, in one
batched attention call), then prefill chunks. Each sequence that reaches its end asks for outputs at its last
``ScheduledSeq.num_outputs`` positions (1, or 1 + speculative lookahead tokens); those rows
alone become logits, and one batched sampler turns them into tokens (and probabilities).
Slots are computed from block tables with tensor ops, not per-token Python lists. A draft model's
runner may sample from the first ``vocab_limit`` token ids only (its head cut to those rows).
On CUDA, decode-only steps replay CUDA graphs (``cuda_graph.DecodeGraphs``); the pool holds one
scratch block past the block manager's blocks, where a graph's padded rows write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from ..layers.attention import AttentionMetadata, DecodeGroups, PrefillSpan
from ..layers.linear import Linear
from ..layers.sampler import Sampler, TokenHistory
from ..models.config import ModelConfig
from .cuda_graph import DecodeGraphs
from .scheduler import ScheduledSeq
from .structured import row_masks

# Keys every attention row reads at least (masked past the row's own context). torch's CPU softmax
# sums a row shorter than its vector width (16 floats on AVX-512) in another order than the same
# row padded with masked keys to a longer one: a lone decode of a 9-token context and the same
# decode padded to a batch-mate's 36 keys differed in the last bit of the normalizer, the bf16
# probabilities with it, and at a near tie greedy picked another token than the request alone.
# Every row reads at least this many keys, so its sum runs one way whatever its batch.
MIN_KEYS = 16


@dataclass
class StepResult:
    """Per sequence, the tokens sampled at each output position (or the row's own error)."""

    tokens: dict[int, list[int] | BaseException]
    probs: dict[int, torch.Tensor] | None = None  # seq_id -> [num_outputs, vocab]
    # seq_id -> [num_outputs, vocab] raw log-probs, for the sequences that ask for logprobs only
    logprobs: dict[int, torch.Tensor] | None = None


def _zeros_on_demand(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor whose CPU pages are committed only when first written.

    ``torch.zeros`` writes every byte, so an idle 1 GiB KV pool would be 1 GiB of resident
    memory; calloc (through numpy) maps zero pages lazily. Zeros matter: padded key slots are
    masked, but their values still meet a 0 weight, and 0 * NaN would be NaN.
    """
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    import math

    import numpy as np

    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)


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
        vocab_limit: int | None = None,
        cuda_graphs: bool = True,
        max_decode_rows: int = 32,
        max_context: int = 2048,
    ) -> None:
        self.model: Any = model  # a models.llama.CausalLM
        self.config = config
        self.block_size = block_size
        self.device = device
        # one scratch block past the managed ones: only a CUDA graph's padded rows use it
        shape = (config.num_layers, 2, config.num_kv_heads, (num_blocks + 1) * block_size,
                 config.head_dim)
        self.kv_cache = _zeros_on_demand(shape, dtype, device)  # [L, 2, KVH, num_slots, D]
        self.graphs: DecodeGraphs | None = None
        if cuda_graphs and device.type == "cuda":
            self.graphs = DecodeGraphs(model, self.kv_cache, num_blocks * block_size,
                                       max_rows=max_decode_rows, max_context=max_context)
        self.sampler = Sampler(seed)
        # a draft's cut head: tokens are sampled among ids below vocab_limit only
        head = cast(Linear, model.lm_head)
        self.head = head.first_rows(vocab_limit) if vocab_limit else None
        # the engine's TokenIndex, set at its first response_format request (engine/structured.py)
        self.token_index: Any = None

    def _slot_table(self, tables: list[list[int]], length: int) -> torch.Tensor:
        """Slots of positions 0..length-1 for each block table: [B, length] (0 past the end)."""
        bs = self.block_size
        width = -(-length // bs)
        padded = [t[:width] + [0] * (width - len(t[:width])) for t in tables]
        bt = torch.tensor(padded, dtype=torch.long)  # [B, width]
        pos = torch.arange(length)  # [length]
        return bt[:, pos // bs] * bs + pos % bs  # [B, length]

    @staticmethod
    def _groups(rows: list[int], lens: torch.Tensor, dev: torch.device) -> DecodeGroups:
        """S sequences of rows[s] decode rows each (lengths ``lens``, flattened) as S groups of
        Q = max(rows) query slots; a padding slot repeats its group's first row and sees one key."""
        nq = max(rows)
        index = torch.zeros(len(rows), nq, dtype=torch.long)  # [S, Q]
        glens = torch.ones(len(rows), nq, dtype=torch.long)  # [S, Q]
        slot: list[int] = []
        start = 0
        for g, r in enumerate(rows):
            index[g] = start
            index[g, :r] = torch.arange(start, start + r)
            glens[g, :r] = lens[start : start + r]
            slot.extend(range(g * nq, g * nq + r))
            start += r
        return DecodeGroups(nq, index.view(-1).to(dev), torch.tensor(slot, device=dev), glens.to(dev))

    def prepare(
        self, scheduled: list[ScheduledSeq]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[ScheduledSeq]]:
        """Returns (input_ids [T], positions [T], metadata, batch in flattened order)."""
        # Decode rows: single tokens, and tokens with lookaheads (every position an output), so
        # a lookahead position is computed exactly as if it had been decoded on its own.
        decode = [s for s in scheduled if s.num_new_tokens == 1 or s.num_new_tokens == s.num_outputs]
        prefill = [s for s in scheduled if s not in decode]
        ids: list[int] = []
        pos: list[int] = []
        slot_parts: list[torch.Tensor] = []
        dev = self.device
        meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long))
        if decode:
            for s in decode:
                c = s.seq.num_computed_tokens
                ids.extend(s.seq.token_ids[c : c + s.num_new_tokens])
                pos.extend(range(c, c + s.num_new_tokens))
            lens_t = torch.tensor(pos, dtype=torch.long) + 1  # [B] context incl. the row's token
            rows = [s.num_new_tokens for s in decode]
            # one row of slots per sequence, and the sequence of each decode row
            width = max(int(lens_t.max()), MIN_KEYS)
            gather = self._slot_table([s.seq.block_table for s in decode], width)  # [S, L]
            owner = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(rows))  # [B]
            slot_parts.append(gather[owner, lens_t - 1])  # [B]
            if max(rows) > 1 and self.graphs is None and dev.type == "cpu":
                # drafts to verify: one gathered context per sequence, its rows as a group
                meta.decode_groups = self._groups(rows, lens_t, dev)
            elif max(rows) > 1:
                gather = gather[owner]  # [B, L]: a row of slots per decode row
            meta.num_decode = len(ids)
            meta.decode_gather = gather.to(dev)
            meta.decode_lens = lens_t.to(dev)
        for s in prefill:
            c, n = s.seq.num_computed_tokens, s.num_new_tokens
            start = len(ids)
            ids.extend(s.seq.token_ids[c : c + n])
            pos.extend(range(c, c + n))
            # keys past c + n (to MIN_KEYS) lie after every query: the causal mask hides them
            ctx_slots = self._slot_table([s.seq.block_table], max(c + n, MIN_KEYS))[0]  # [>= c + n]
            slot_parts.append(ctx_slots[c : c + n])
            meta.prefills.append(PrefillSpan(start, start + n, ctx_slots.to(dev), c))
        meta.slot_mapping = torch.cat(slot_parts).to(dev)  # [T]
        input_ids = torch.tensor(ids, dtype=torch.long, device=dev)  # [T]
        positions = torch.tensor(pos, dtype=torch.long, device=dev)  # [T]
        return input_ids, positions, meta, decode + prefill

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSeq], *, return_probs: bool = False) -> StepResult:
        """Run the step; sample at each output position of the sequences that reach their end."""
        if not scheduled:
            return StepResult({})
        input_ids, positions, meta, order = self.prepare(scheduled)
        hidden = self.graphs.forward(input_ids, positions, meta) if self.graphs else None
        if hidden is None:
            hidden = self.model(input_ids, positions, self.kv_cache, meta)  # [T, hidden]
        rows: list[int] = []
        owners: list[ScheduledSeq] = []
        offset = 0
        for s in order:
            offset += s.num_new_tokens
            k = s.num_outputs
            rows.extend(range(offset - k, offset))
            owners.extend([s] * k)
        if not rows:
            return StepResult({})
        logits = self.model.compute_logits(hidden[rows], head=self.head)  # [R, vocab or limit]
        out = self.sampler(logits, [s.seq.seq_id for s in owners], [s.seq.params for s in owners],
                           return_probs=return_probs, histories=self._histories(order),
                           masks=row_masks(order, self.token_index, logits.device))
        tokens: dict[int, list[int] | BaseException] = {}
        probs: dict[int, list[torch.Tensor]] = {}
        for i, (s, tok) in enumerate(zip(owners, out.tokens, strict=True)):
            sid = s.seq.seq_id
            got = tokens.setdefault(sid, [])
            if isinstance(tok, BaseException) or isinstance(got, BaseException):
                tokens[sid] = tok if isinstance(tok, BaseException) else got
            else:
                got.append(tok)
            if out.probs is not None:
                probs.setdefault(sid, []).append(out.probs[i])
        stacked = {sid: torch.stack(p) for sid, p in probs.items()} if out.probs is not None else None
        logprobs: dict[int, list[torch.Tensor]] = {}
        for i, row in (out.logprobs or {}).items():  # rows of one sequence come in position order
            logprobs.setdefault(owners[i].seq.seq_id, []).append(row)
        lp = {sid: torch.stack(r) for sid, r in logprobs.items()} if logprobs else None
        return StepResult(tokens, stacked, lp)

    @staticmethod
    def _histories(order: list[ScheduledSeq]) -> list[TokenHistory | None] | None:
        """Per output row, the tokens its penalties read (None when no row's request has any):
        the row at position i predicts token i + 1, so its context is token_ids[: i + 1], the
        drafts before it included."""
        if not any(s.num_outputs and s.seq.params.has_penalties for s in order):
            return None
        out: list[TokenHistory | None] = []
        for s in order:
            seq, k = s.seq, s.num_outputs
            if not seq.params.has_penalties:
                out.extend([None] * k)
                continue
            end = seq.num_computed_tokens + s.num_new_tokens  # one past this step's last position
            out.extend(TokenHistory(seq.token_ids, seq.num_prompt_tokens, end - k + 1 + j) for j in range(k))
        return out

    @torch.inference_mode()
    def prompt_logits(self, scheduled: ScheduledSeq) -> torch.Tensor:
        """Logits at every position of one prefill chunk: [n, vocab] (parity tests)."""
        input_ids, positions, meta, _ = self.prepare([scheduled])
        hidden = self.model(input_ids, positions, self.kv_cache, meta)
        return self.model.compute_logits(hidden)

    def release(self, seq_id: int) -> None:
        self.sampler.release(seq_id)
