"""Two steps of the llama.cpp token loop: the prompt's prefill into the KV cache, and the check that
a drawn token's logit is a number.

Split from ``llama_cpp`` (its size); its generation loop calls them as ``llama_cpp._prefill_head``
and ``llama_cpp._check_finite``, so a test that patches those names there reaches the loop.
"""

from __future__ import annotations

from typing import Any

from .._exceptions import EdgeError


def _check_finite(logits: Any, token: int, n_vocab: int) -> None:
    """Refuse a drawn token whose logit is NaN, as the ONNX backend refuses NaN logits.

    Damaged weights (a NaN in a norm or a scale) make every logit NaN, and llama.cpp's samplers
    still pick a token: greedy keeps the first (SmolLM2's <|endoftext|>, so an empty answer that
    "stopped"), a sampled draw any ("........"), with no error. A NaN row always gives a NaN pick,
    so only that logit is read (``logits``: llama.cpp's float pointer, the position that produced
    ``token``); the whole row is counted only to say so."""
    if logits[token] != logits[token]:  # NaN
        import numpy as np

        row = np.ctypeslib.as_array(logits, shape=(n_vocab,))
        raise EdgeError(
            f"The model produced NaN logits ({int(np.isnan(row).sum())} of {row.shape[0]}): its "
            "weights are damaged. Check the model file (`hybridllm models verify`) and pull it "
            "again, or pass another."
        )


def _prefill_head(llm: Any, tokens: list[int]) -> None:
    """Decode every prompt token but the last into the KV cache, keeping the prefix it holds.

    llama.cpp's logits for a token decoded alone differ in the last bits from its logits in a
    batch, and llama-cpp-python decodes a cached prompt's last token again alone: a new prompt
    (decoded in one batch) and the same prompt asked again got different answers at temperature 0
    (SmolLM2 alternated between two). With the rest cached, ``generate`` decodes the last token
    alone every time, as the ONNX backend does."""
    import numpy as np

    head = tokens[:-1]
    cached = llm.input_ids[: min(llm.n_tokens, len(head))]
    differ = np.flatnonzero(cached != np.asarray(head[: len(cached)], dtype=cached.dtype))
    common = int(differ[0]) if differ.size else len(cached)
    if common < llm.n_tokens and not llm._ctx.kv_cache_seq_rm(-1, common, -1):
        llm.reset()  # a cache that cannot be cut (a recurrent model): decoded from the start
        common = 0
    llm.n_tokens = common
    llm.eval(head[common:])
