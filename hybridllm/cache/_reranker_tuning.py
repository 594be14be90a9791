"""Fine-tuning the cache reranker's cross-encoder with torch on labelled question pairs."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .encoder import pad_batch
from .evaluate import PairSet
from .prepare import EMBEDDER_ID
from .reranker import MAX_TOKENS

Say = Callable[[str], None]


Item = tuple[str, str, int]  # (query, cached, label)


def training_items(pairs: PairSet, idx: np.ndarray) -> list[Item]:
    """The labelled pairs at ``idx`` as (query, cached, label): the cache compares a new question
    (``text_b``) with a stored one (``text_a``)."""
    return [(pairs.text_b[i], pairs.text_a[i], pairs.labels[i]) for i in idx]


def _batches(items: list[Item], batch_size: int, rng: random.Random) -> list[list[Item]]:
    """Shuffled batches of both orders of every item, grouped by length."""
    both = [(q, c, label) for q, c, label in items] + [(c, q, label) for q, c, label in items]
    rng.shuffle(both)
    out = []
    chunk = batch_size * 100  # sort within chunks so a batch pads little but stays random
    for start in range(0, len(both), chunk):
        part = sorted(both[start : start + chunk], key=lambda t: len(t[0]) + len(t[1]))
        out += [part[k : k + batch_size] for k in range(0, len(part), batch_size)]
    rng.shuffle(out)
    return out


def _tensors(tokenizer: Any, batch: list[Item]) -> tuple[Any, ...]:
    import torch

    ids, mask, types = pad_batch(tokenizer.encode_batch([(q, c) for q, c, _ in batch]))
    labels = torch.tensor([float(label) for _, _, label in batch])
    return torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types), labels


def _cpu_has_bf16() -> bool:
    """bf16 autocast pays on CPUs with native bf16 math (AVX512-BF16, AMX); elsewhere fp32 is faster."""
    import torch

    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # private helpers of torch.cpu: fall back to fp32
        return False


def fine_tune(
    items: list[Item],
    *,
    epochs: float,
    lr: float,
    batch_size: int,
    threads: int,
    seed: int,
    say: Say,
) -> dict[str, np.ndarray]:
    """Fine-tune the cross-encoder; return its weights (word embeddings left out) as arrays."""
    import torch
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    from ..models import pull
    from .export import cross_encoder_module
    from .onnx_graph import remap

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    rng = random.Random(seed)
    source = pull(EMBEDDER_ID)
    model = cross_encoder_module(json.loads((source / "config.json").read_text()))
    model.encoder.load_state_dict(remap(load_file(str(source / "model.safetensors"))), strict=True)
    model.encoder.word.weight.requires_grad_(False)  # shipped weights then need no vocabulary table
    model.train()
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_TOKENS)

    batches: list[list[Item]] = []
    total = max(1, int(round(epochs * len(items) * 2 / batch_size)))
    while len(batches) < total:
        batches += _batches(items, batch_size, rng)
    batches = batches[:total]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    warmup = max(1, int(0.06 * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, max(0.0, (total - s) / max(1, total - warmup)))
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    amp = device == "cuda" or _cpu_has_bf16()
    precision = "bf16 autocast" if amp else "fp32"
    say(f"fine-tuning on {len(items)} pairs (both orders): {total} steps of {batch_size}, "
        f"{device}, {precision}")
    start = time.perf_counter()
    running = None
    for step, batch in enumerate(batches):
        ids, mask, types, labels = (t.to(device) for t in _tensors(tokenizer, batch))
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            logits = model(ids, mask, types)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), labels)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if (step + 1) % 200 == 0 or step + 1 == total:
            spent = time.perf_counter() - start
            eta = spent / (step + 1) * (total - step - 1)
            say(f"step {step + 1}/{total}  loss {running:.4f}  {spent:.0f}s spent, about {eta:.0f}s left")
    return {
        name: tensor.detach().float().cpu().numpy()
        for name, tensor in model.state_dict().items()
        if name != "encoder.word.weight"
    }
