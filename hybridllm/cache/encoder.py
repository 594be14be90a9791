"""The ONNX encoder base shared by the sentence embedder and the cache reranker (run time only).

A prepared folder (:mod:`.prepare`) holds the int8 and fp32 ONNX graphs and ``tokenizer.json``;
this loads one graph into an ONNX Runtime CPU session with the tokenizer and pads batches. Needs
only ``onnxruntime``, ``tokenizers`` and numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import ModelError
from ..prompts import valid_text
from .prepare import FP32_NAME, INT8_NAME, TOKENIZER_NAME


def cpu_session(ort: Any, path: Path, num_threads: int | None) -> Any:
    """An ONNX Runtime CPU session tuned for one short input at a time.

    One thread by default: a cache lookup embeds one short question, where a second thread adds
    synchronization and, on a busy device, spin-waiting (measured on 2 loaded cores: p50 3.3 ms
    with one thread, 11 ms with two). Batch jobs may ask for more.
    """
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = num_threads or 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # errors only: ONNX Runtime's graph notes are not for the user
    if opts.intra_op_num_threads > 1:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def pad_batch(encodings: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids, attention mask and token types of tokenizer encodings, right-padded with zeros to
    the longest: three ``[batch, seq]`` int64 arrays (the graph's inputs; the trainer's too)."""
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(encodings), width), dtype=np.int64)  # [batch, seq]
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for row, enc in enumerate(encodings):
        n = len(enc.ids)
        ids[row, :n] = enc.ids
        mask[row, :n] = 1
        types[row, :n] = enc.type_ids
    return ids, mask, types


class OnnxEncoder:
    """An ONNX Runtime session on ``folder``'s graph and its tokenizer (thread-safe: sessions allow
    concurrent ``run`` calls and the tokenizer is only read after construction)."""

    what = "encoder"  # for messages

    def __init__(self, folder: Path, *, quantized: bool, num_threads: int | None, max_tokens: int) -> None:
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ModelError(f"The {self.what} needs onnxruntime and tokenizers: {exc}") from exc
        self.path = folder / (INT8_NAME if quantized else FP32_NAME)
        try:
            self._session: Any = cpu_session(ort, self.path, num_threads)
            tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_NAME))
        except Exception as exc:  # a truncated or foreign file
            raise ModelError(
                f"Cannot load the {self.what} from {folder} ({exc}); delete the folder and run "
                "`hybridllm models prepare minilm-l6-v2`."
            ) from exc
        tokenizer.no_padding()  # each batch is padded to its own longest input in run()
        tokenizer.enable_truncation(max_tokens)  # pairs: longest-first across the two texts
        self._tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.quantized = quantized

    def fits(self, *texts: str) -> bool:
        """Whether the graph reads each of ``texts`` whole (the tokenizer cuts what is longer)."""
        # a word piece covers about one character at the least (lower-casing may turn one into
        # two): a text this short always fits, without tokenizing it
        longer = [valid_text(t) for t in texts if len(t) > (self.max_tokens - 2) // 2]
        return not any(e.overflowing for e in self._tokenizer.encode_batch(longer))

    def fits_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """``[n]`` bool: whether the graph reads each pair whole."""
        encodings = self._tokenizer.encode_batch([(valid_text(a), valid_text(b)) for a, b in pairs])
        return np.array([not e.overflowing for e in encodings], dtype=bool)

    def run(self, inputs: Sequence[str] | Sequence[tuple[str, str]]) -> np.ndarray:
        """The graph's output for one batch of texts or text pairs."""
        # a direct caller may pass any str: half an emoji would make the tokenizer raise TypeError
        texts = [valid_text(x) if isinstance(x, str) else tuple(map(valid_text, x)) for x in inputs]
        ids, mask, types = pad_batch(self._tokenizer.encode_batch(texts))
        (out,) = self._session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        return np.asarray(out, dtype=np.float32)
