"""Sentence embeddings on the device: all-MiniLM-L6-v2 in ONNX Runtime (int8 by default).

At run time only ``onnxruntime``, ``tokenizers`` and numpy are needed. The ONNX files live in
``data_dir()/embedders/minilm-l6-v2/``; the first use builds them from the model package's weights,
without torch (:mod:`.prepare`), and says so in one line on stderr.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np

from .._cpus import usable_cpus
from .._exceptions import ModelError
from ..models.store import sha256_file
from .encoder import OnnxEncoder
from .prepare import prepare_embedder

MAX_TOKENS = 256  # all-MiniLM-L6-v2 was trained with max_seq_length 256
DIM = 384


class Embedder(OnnxEncoder):
    """all-MiniLM-L6-v2 sentence embeddings: ``[n, 384]`` float32, L2-normalized. Thread-safe."""

    dim: int = DIM
    what = "embedder"

    def __init__(self, *, quantized: bool = True, num_threads: int | None = None) -> None:
        super().__init__(
            prepare_embedder(), quantized=quantized, num_threads=num_threads, max_tokens=MAX_TOKENS
        )

    def embed(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = 1,
        workers: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> np.ndarray:
        """Embed ``texts``; returns ``[len(texts), 384]`` float32 unit vectors. ``progress(done,
        total)`` is called after each batch, from the calling thread.

        One text at a time by default, so that every vector is the one :meth:`embed_one` gives at
        run time: the int8 model quantizes activations with one scale over the whole batch, padding
        included, so a text's vector depends on the texts beside it (cosine down to 0.993 with
        batches of 32 on MMLU prompts, which moved 17 of 400 router decisions across the
        threshold). On two cores it is also faster (105 MMLU prompts/s against 71). A larger
        ``batch_size`` trades that identity for speed where many cores make batches pay.

        Long lists run their batches on ``workers`` threads (default: one per CPU this process may
        use, at most 8; a short list stays on the calling thread). Each batch still runs on one
        ONNX Runtime thread, alone, so the vectors are the same bit for bit as on one thread."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of strings; use embed_one() for one text")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if workers is not None and workers < 1:
            raise ValueError("workers must be at least 1")
        # a numpy array or pandas Series: `not texts` is ambiguous and a Series' texts[i] reads
        # its index labels, so read any sequence as a plain list once
        texts = list(texts)
        for i, text in enumerate(texts):
            _check_text(text, f"embed() item {i}")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        # sort by length so each batch pads little, then restore the caller's order
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
        threads = _default_workers(len(batches)) if workers is None else min(workers, len(batches))
        if threads == 1:
            done = 0
            for idx in batches:
                out[idx] = self.run([texts[i] for i in idx])
                done += len(idx)
                if progress is not None:
                    progress(done, len(texts))
            return out
        pool = ThreadPoolExecutor(threads, thread_name_prefix="hybridllm-embed")
        try:
            pending = {pool.submit(self.run, [texts[i] for i in idx]): idx for idx in batches}
            done = 0
            for future in as_completed(pending):
                idx = pending[future]
                out[idx] = future.result()
                done += len(idx)
                if progress is not None:
                    progress(done, len(texts))
        finally:
            # an error or Ctrl-C here: drop the batches not started rather than wait for them
            pool.shutdown(wait=True, cancel_futures=True)
        return out

    def embed_one(self, text: str) -> np.ndarray:
        """Embed one text; returns ``[384]`` float32 unit vector."""
        _check_text(text, "embed_one()")  # a tuple would be embedded as a text pair
        return self.run([text])[0]

    @functools.cached_property
    def fingerprint(self) -> str:
        """A short hash of the ONNX file this embedder runs: vectors kept on disk are reused only
        with the model that made them."""
        return sha256_file(Path(self.path))[:12]


def _check_text(text: object, where: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"{where} must be a string, not {type(text).__name__}")


def _default_workers(num_batches: int) -> int:
    """Threads for ``num_batches`` batches: one per usable CPU (at most 8), but at least 16
    batches a thread, so a few texts (a cache lookup, a request) never start a pool."""
    return max(1, min(usable_cpus(), 8, num_batches // 16))


_shared: dict[bool, Embedder] = {}
_failed: dict[bool, ModelError] = {}
_shared_lock = threading.Lock()


def get_embedder(*, quantized: bool = True) -> Embedder:
    """The process-wide shared :class:`Embedder` (created on first call, thread-safe).

    An embedder that cannot be prepared or loaded fails once: later calls raise the same error at
    once, without trying (and saying so) again, until the process restarts.
    """
    embedder = _shared.get(quantized)
    if embedder is None:
        with _shared_lock:
            embedder = _shared.get(quantized)
            if embedder is None:
                if quantized in _failed:
                    raise _failed[quantized]
                try:
                    embedder = _shared[quantized] = Embedder(quantized=quantized)
                except ModelError as exc:
                    _failed[quantized] = exc
                    raise
    return embedder
