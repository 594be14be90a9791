"""Attention over a paged KV cache.

The cache of one layer is two tensors ``[num_kv_heads, num_blocks * block_size, head_dim]``
(head-major: a gather of slots is ``[KVH, B, L, D]`` with every ``[L, D]`` matrix contiguous, so
the attention matmuls read it in place instead of copying a transposed view per layer); token
position p of a sequence lives in slot ``block_table[p // bs] * bs + p % bs``.
A step's tokens are flattened: first one token per decoding sequence, then each prefill chunk.
Decode tokens attend in one batched call (keys gathered and padded, padding masked). A
sequence verifying drafts has several decode rows over one context: on CPU its keys are gathered
once and its rows attend as the queries of one group (``DecodeGroups``), each masked to its own
length, instead of one gathered copy of the whole context per row (at a 500-token context the
1.5B's 28 layers gather 14 MB a row). A row's result stays bit for bit what it is alone (the
scores and the weighted sum are row by row, and a key past a row's end gets probability exactly
0), provided the CPU's matmul computes a row the same way whatever the number of rows: true of
oneDNN's AVX-512 BF16 kernels (and of the AMD EPYCs' earlier runs), not of its AMX ones, which
``cloud_server`` keeps off where the CPU has them (``cpu_features.py``);
``test_multi_token_step.py`` checks it against lone decodes.
Each prefill chunk gathers its sequence's keys and attends with a causal mask offset by the
tokens already cached (prefix hits and earlier chunks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class PrefillSpan:
    start: int  # first flattened token of the chunk
    end: int
    gather: torch.Tensor  # [context_len] slots of positions 0..context_len-1
    q_start: int  # position of the chunk's first token


@dataclass
class DecodeGroups:
    """Decode rows as S groups (one per sequence) of Q query slots; ``decode_gather`` is then
    ``[S, L]``, one row of slots per sequence."""

    queries: int  # Q, the most rows of one sequence
    index: torch.Tensor  # [S * Q] decode row of each query slot (a padding slot repeats a row)
    rows: torch.Tensor  # [B] query slot of each decode row
    lens: torch.Tensor  # [S, Q] keys each query slot sees (its row's context length)


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] where each new token's k/v is written
    num_decode: int = 0
    decode_gather: torch.Tensor | None = None  # [B, max_len] slots, padded with slot 0
    decode_lens: torch.Tensor | None = None  # [B] context lengths including the new token
    decode_groups: DecodeGroups | None = None  # rows grouped by sequence (CPU, drafts verified)
    prefills: list[PrefillSpan] = field(default_factory=list)
    _masks: dict = field(default_factory=dict)

    def forget_masks(self) -> None:
        """Drop the cached masks (a CUDA graph's static metadata changes contents, not identity)."""
        self._masks.clear()

    def decode_mask(self, window: int | None) -> torch.Tensor:
        key = ("decode", window)
        if key not in self._masks:
            if self.decode_gather is None or self.decode_lens is None:
                raise RuntimeError("decode_mask needs decode_gather and decode_lens")
            max_len = self.decode_gather.shape[1]
            j = torch.arange(max_len, device=self.decode_gather.device)  # [L]
            groups = self.decode_groups
            lens = (groups.lens if groups is not None else self.decode_lens.unsqueeze(1))[..., None]
            mask = j < lens  # [B, 1, L], or [S, Q, L] for groups
            if window is not None:
                mask &= (lens - 1 - j) < window
            self._masks[key] = mask
        return self._masks[key]

    def prefill_mask(self, i: int, window: int | None) -> torch.Tensor:
        key = ("prefill", i, window)
        if key not in self._masks:
            span = self.prefills[i]
            n, ctx = span.end - span.start, span.gather.shape[0]
            dev = span.gather.device
            q_pos = torch.arange(span.q_start, span.q_start + n, device=dev).unsqueeze(1)  # [n, 1]
            k_pos = torch.arange(ctx, device=dev).unsqueeze(0)  # [1, ctx]
            mask = k_pos <= q_pos  # [n, ctx]
            if window is not None:
                mask &= (q_pos - k_pos) < window
            self._masks[key] = mask
        return self._masks[key]


def attend(
    q: torch.Tensor,  # [KVH, B, G*Q, D]: the G query heads of a key head, Q queries each
    k: torch.Tensor,  # [KVH, B, L, D]
    v: torch.Tensor,  # [KVH, B, L, D]
    mask: torch.Tensor,  # [B or 1, Q, L] True where a query may see a key
    scale: float,
) -> torch.Tensor:  # [KVH, B, G*Q, D]
    """Grouped-query attention written out: softmax(q k^T * scale + mask) v. q k^T comes out of
    the matmul in the activation dtype (bf16 rounds a score to 8 bits: ~0.06 at a score of 36;
    fp16 overflows past |q k^T| = 65504), then scale, mask and softmax are fp32. On 2,048 keys with
    scaled scores up to 23 that moves a weight by up to 11% and the output by 0.025 (0.008 with fp32
    scores). Not taken: an fp32 q k^T, or a second bf16 matmul returning the rounding
    (``baddbmm(-s, q, k^T)``, 300x closer): on CPU both make a row's result change with the
    number of rows at small sizes, which the lone-vs-group bit-for-bit rule above rests on.

    The G = H / KVH query heads of a key head share one matmul ([G*Q, D] x [D, L]). On CPU this
    beats torch's SDPA with a mask by 1.5-30x at decode and prefill sizes (bf16 most of all).
    """
    kvh, b, gq, _ = q.shape
    nq = mask.shape[-2]
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale  # [KVH, B, G*Q, L]
    scores = scores.view(kvh, b, gq // nq, nq, -1).masked_fill(~mask[None, :, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype).view(kvh, b, gq, -1)
    return torch.matmul(probs, v)


def paged_attention(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,  # [T, KVH, D]
    k_cache: torch.Tensor,  # [KVH, num_slots, D]
    v_cache: torch.Tensor,  # [KVH, num_slots, D]
    meta: AttentionMetadata,
    *,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:  # [T, H, D]
    k_cache.index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
    v_cache.index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
    kvh, d = k_cache.shape[0], k_cache.shape[2]
    h = q.shape[1]
    out = torch.empty_like(q)
    b = meta.num_decode
    if b:
        gather = meta.decode_gather  # [B, L], or [S, L] for groups
        assert gather is not None, "decode rows without a gather table"
        n, g = gather.shape[0], h // kvh
        flat = gather.view(-1)  # index_select copies whole D-rows: ~10x faster than k[:, gather]
        kd = k_cache.index_select(1, flat).view(kvh, n, gather.shape[1], d)  # [KVH, B or S, L, D]
        vd = v_cache.index_select(1, flat).view(kvh, n, gather.shape[1], d)
        groups = meta.decode_groups
        if groups is None:
            qd = q[:b].view(b, kvh, g, d).transpose(0, 1)  # [KVH, B, G, D]
            od = attend(qd, kd, vd, meta.decode_mask(window), scale)  # [KVH, B, G, D]
            out[:b] = od.transpose(0, 1).reshape(b, h, d)
        else:  # [S * Q, H, D] -> [KVH, S, G * Q, D]: a group's queries in the prefill layout
            nq = groups.queries
            qd = q[:b].index_select(0, groups.index).view(n, nq, kvh, g, d)
            qd = qd.permute(2, 0, 3, 1, 4).reshape(kvh, n, g * nq, d)
            od = attend(qd, kd, vd, meta.decode_mask(window), scale)  # [KVH, S, G * Q, D]
            od = od.view(kvh, n, g, nq, d).permute(1, 3, 0, 2, 4).reshape(n * nq, h, d)
            out[:b] = od.index_select(0, groups.rows)
    for i, span in enumerate(meta.prefills):
        n = span.end - span.start
        # [n, H, D] -> [KVH, 1, G*n, D]: the n queries of each query head, heads of a key head
        # together (head-major, as the [H, n, D] layout of the whole chunk)
        qp = q[span.start : span.end].transpose(0, 1).reshape(kvh, 1, (h // kvh) * n, d)
        kp = k_cache.index_select(1, span.gather).unsqueeze(1)  # [KVH, 1, ctx, D]
        vp = v_cache.index_select(1, span.gather).unsqueeze(1)
        mask = meta.prefill_mask(i, window)[None]  # [1, n, ctx]
        op = attend(qp, kp, vp, mask, scale)  # [KVH, 1, G*n, D]
        out[span.start : span.end] = op.view(h, n, d).transpose(0, 1)
    return out
