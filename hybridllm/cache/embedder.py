"""Sentence embeddings on the device: all-MiniLM-L6-v2 in ONNX Runtime (int8 by default).

At run time only ``onnxruntime``, ``tokenizers`` and numpy are needed. The ONNX files live in
``data_dir()/embedders/minilm-l6-v2/``; on first use they are exported when torch is importable
(:mod:`hybridllm.cache.export`), else a :class:`ModelError` says how to prepare them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import ModelError
from . import export as _export

MAX_TOKENS = 256  # all-MiniLM-L6-v2 was trained with max_seq_length 256
DIM = 384


def _ensure_exported() -> Path:
    out = _export.embedder_dir()
    if _export.is_exported(out):
        return out
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ModelError(
            f"The embedder is not prepared (no ONNX files in {out}) and torch is not installed to "
            "export it. Run `hybridllm models prepare minilm-l6-v2` on a machine with "
            "`pip install 'hybridllm[export]'`."
        ) from None
    return _export.export(out_dir=out)


def cpu_session(ort: Any, path: Path, num_threads: int | None) -> Any:
    """An ONNX Runtime CPU session tuned for one short input at a time.

    One thread by default: a cache lookup embeds one short question, where a second thread adds
    synchronization and, on a busy device, spin-waiting (measured on 2 loaded cores: p50 3.3 ms
    with one thread, 11 ms with two). Batch jobs may ask for more.
    """
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = num_threads or 1
    opts.inter_op_num_threads = 1
    if opts.intra_op_num_threads > 1:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


class Embedder:
    """all-MiniLM-L6-v2 sentence embeddings: ``[n, 384]`` float32, L2-normalized.

    Thread-safe: ONNX Runtime sessions allow concurrent ``run`` calls and the tokenizer is only
    read after construction.
    """

    dim: int = DIM

    def __init__(self, *, quantized: bool = True, num_threads: int | None = None) -> None:
        folder = _ensure_exported()
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ModelError(f"The embedder needs onnxruntime and tokenizers: {exc}") from exc
        path = folder / (_export.INT8_NAME if quantized else _export.FP32_NAME)
        try:
            self._session: Any = cpu_session(ort, path, num_threads)
            tokenizer = Tokenizer.from_file(str(folder / _export.TOKENIZER_NAME))
        except Exception as exc:  # a truncated or foreign file
            raise ModelError(
                f"Cannot load the embedder from {folder} ({exc}); delete the folder and run "
                "`hybridllm models prepare minilm-l6-v2`."
            ) from exc
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.no_padding()  # each batch is padded to its own longest text below
        self._tokenizer = tokenizer
        self.quantized = quantized
        self.path = path

    def _encode(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        encodings = self._tokenizer.encode_batch(list(texts))
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), width), dtype=np.int64)  # [batch, seq]
        mask = np.zeros_like(ids)
        for row, enc in enumerate(encodings):
            ids[row, : len(enc.ids)] = enc.ids
            mask[row, : len(enc.ids)] = 1
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}

    def embed(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
        """Embed ``texts``; returns ``[len(texts), 384]`` float32 unit vectors."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of strings; use embed_one() for one text")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        # sort by length so each batch pads little, then restore the caller's order
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            (vecs,) = self._session.run(None, self._encode([texts[i] for i in idx]))
            out[idx] = vecs
        return out

    def embed_one(self, text: str) -> np.ndarray:
        """Embed one text; returns ``[384]`` float32 unit vector."""
        (vecs,) = self._session.run(None, self._encode([text]))
        return np.asarray(vecs[0], dtype=np.float32)


_shared: dict[bool, Embedder] = {}
_shared_lock = threading.Lock()


def get_embedder(*, quantized: bool = True) -> Embedder:
    """The process-wide shared :class:`Embedder` (created on first call, thread-safe)."""
    embedder = _shared.get(quantized)
    if embedder is None:
        with _shared_lock:
            embedder = _shared.get(quantized)
            if embedder is None:
                embedder = _shared[quantized] = Embedder(quantized=quantized)
    return embedder
