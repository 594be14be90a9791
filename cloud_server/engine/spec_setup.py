"""Speculative decoding at start-up: the draft model, its vocabulary and tokenizer, CUDA graph bounds."""

from __future__ import annotations

import logging
from typing import Any

from ..config import EngineConfig
from ..exceptions import ConfigError
from .sampling_params import MAX_SPECULATIVE_TOKENS

logger = logging.getLogger("cloud_server.engine.llm_engine")  # the engine's log name, as before the split

# Default draft vocabulary: the first 32768 ids. Byte-level BPE numbers tokens in merge order,
# so low ids are the frequent ones; the Qwen2.5-Coder 0.5B's head shrinks from 151,936 rows
# (7.9 ms of a 33 ms draft step on one thread) to 32,768 (1.4 ms); acceptance 0.80 -> 0.75.
_DRAFT_VOCAB = 32768


class SpecSetupMixin:
    """``LLMEngine``'s construction of its speculative decoder (and the runners' graph bounds)."""

    config: EngineConfig
    tokenizer: Any
    model_config: Any
    max_model_len: int
    device: Any
    dtype: Any
    quantization: str

    def _graph_args(self, config: EngineConfig) -> dict[str, Any]:
        """CUDA graph buckets: a step's decode rows (every running sequence plus the draft rows: a
        request may ask for prompt lookup on any server) and its key window (the longest context).
        Graphs are captured on first use, so a bound that is never reached costs nothing."""
        rows = config.max_num_seqs + config.spec_max_rows
        # drafts stay inside max_model_len (SpecDecoder.lookahead); a request's own K is at most
        k = config.num_speculative_tokens or MAX_SPECULATIVE_TOKENS
        return {"cuda_graphs": not config.enforce_eager, "max_decode_rows": rows,
                "max_context": self.max_model_len + k + 1}

    def _make_spec_decoder(self, num_blocks: int) -> Any:
        from ..layers.linear import int8_row_block
        from .model_runner import ModelRunner
        from .spec_decode import SpecDecoder
        from .spec_decode.draft import DraftProposer

        config, draft = self.config, None
        if config.draft_model is not None:
            from ..models.loader import load_model

            loaded = load_model(
                config.draft_model,
                device=self.device,
                dtype=self.dtype,
                max_position=self.max_model_len,
                quantization=self.quantization,
            )
            _check_same_tokenizer(self, loaded)
            limit = config.draft_vocab_size
            if limit is None:
                limit = _DRAFT_VOCAB if loaded.config.vocab_size > _DRAFT_VOCAB else 0
            if loaded.config.vocab_size > self.model_config.vocab_size:
                # a draft padded wider than the target: an id past the target's rows is no token
                # of their tokenizer, and it indexed past the target's embedding
                limit = min(limit or loaded.config.vocab_size, self.model_config.vocab_size)
            if 0 < limit < loaded.config.vocab_size:
                logger.info("the draft proposes token ids below %d of %d (--draft-vocab-size)",
                            limit, loaded.config.vocab_size)
            _check_draft_pool(config, self.device, self.dtype, num_blocks, loaded.config)
            draft = DraftProposer(
                ModelRunner(
                    loaded.model,
                    loaded.config,
                    num_blocks=num_blocks,
                    block_size=config.block_size,
                    device=self.device,
                    dtype=self.dtype,
                    seed=config.seed + 1,
                    vocab_limit=limit or None,
                    **self._graph_args(config),
                )
            )
        return SpecDecoder(
            method=config.speculative_method,
            num_speculative_tokens=config.num_speculative_tokens,
            max_model_len=self.max_model_len,
            draft=draft,
            max_spec_rows=config.spec_max_rows,
            row_block=int8_row_block(self.device, self.dtype, self.quantization),
        )


def _check_draft_pool(config: EngineConfig, device: Any, dtype: Any, num_blocks: int,
                      draft_config: Any) -> None:
    """The draft's KV pool (as many blocks as the target's, at the draft's bytes a token) comes on
    top of --kv-cache-memory-mb: on a GPU it must fit the memory left once the target's pool and the
    draft's weights are in, or the allocation failed with a CUDA out-of-memory traceback. (On a CPU
    the command line compares both pools with the machine's memory before the load.)"""
    if device.type != "cuda":
        return
    import torch

    need = num_blocks * config.block_size * draft_config.kv_bytes_per_token(dtype.itemsize)
    free, _ = torch.cuda.mem_get_info(device)
    if need > free:
        raise ConfigError(
            f"the draft model's KV pool needs {need >> 20} MiB ({num_blocks} blocks of "
            f"{config.block_size} tokens, as many as the target's, beyond --kv-cache-memory-mb) "
            f"but {device} has {free >> 20} MiB free: lower --kv-cache-memory-mb"
        )


def _token_count(tokenizer: Any, model_config: Any) -> int:
    """The tokenizer's own ids (added tokens included), else the model's embedding rows."""
    n = getattr(tokenizer, "vocab_size", None)
    return n if isinstance(n, int) and n > 0 else model_config.vocab_size


def _check_same_tokenizer(engine: SpecSetupMixin, draft: Any) -> None:
    """A draft model must speak the target's token ids: same vocabulary, same pieces.

    The tokenizers are compared, not the embedding matrices: Qwen-style checkpoints pad those past
    the tokenizer's ids (151,936 or 152,064 rows for 151,665 ids), differently by model size, and a
    draft padded otherwise still shares every token (its proposals are cut to the target's rows).
    """
    target = engine.tokenizer
    size = _token_count(target, engine.model_config)
    draft_size = _token_count(draft.tokenizer, draft.config)
    problem = None
    if draft_size != size:
        problem = f"vocabulary of {draft_size} tokens, the target's has {size}"
    else:
        sample = "def f(x):\n    return x * 2  # Überprüfung, 数字 42!"
        if draft.tokenizer.encode(sample) != target.encode(sample) or set(
            draft.tokenizer.eos_token_ids
        ) != set(target.eos_token_ids):
            problem = "a different tokenizer"
        else:
            # ids spread over the vocabulary, and its last ones (added and special tokens)
            ids = sorted({*range(0, size, max(1, size // 2000)), *range(max(0, size - 64), size)})
            try:
                same = [draft.tokenizer.decode([i]) for i in ids] == [target.decode([i]) for i in ids]
            except Exception:  # noqa: BLE001 - ids past one tokenizer's end differ by definition
                same = False
            problem = None if same else "a different tokenizer"
    if problem:
        raise ConfigError(
            f"draft model {engine.config.draft_model!r} has {problem}; speculative decoding "
            f"needs a draft that shares the target's tokenizer"
        )
