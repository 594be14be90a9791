"""Embeddings of whole prompt lists kept on disk for training and evaluation (build code).

Embedding ten thousand prompts takes minutes on two cores, so :func:`cached_embeddings` writes them
to an ``.npz`` keyed by content: the embedder's ONNX file hash and the texts' digest. The folder is
``$HYBRIDLLM_EMBEDDINGS_DIR``, else ``data_dir()/router_features/``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .._paths import data_dir
from .dataset import texts_digest
from .features import EMBEDDER_ID, EMBEDDING_DIM, embed_texts


def embedder_fingerprint() -> str:
    """A short hash of the embedder's ONNX file: cached embeddings are only reused with it."""
    from ..cache.embedder import get_embedder

    path = Path(get_embedder().path)
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]


def feature_cache_dir() -> Path:
    """Where :func:`cached_embeddings` keeps its files: ``$HYBRIDLLM_EMBEDDINGS_DIR``, else the data dir.

    The files are keyed by content (embedder file hash and texts digest), so a folder may be shared
    by data dirs: the test suite keeps one outside its empty per-session data dir.
    """
    override = os.environ.get("HYBRIDLLM_EMBEDDINGS_DIR")
    return Path(override).expanduser() if override else data_dir() / "router_features"


def cached_embeddings(
    texts: Sequence[str],
    *,
    cache_dir: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Embeddings of ``texts``, read from or written to an ``.npz`` keyed by their content hash
    (``progress(done, total)`` while embedding what is not cached)."""
    folder = cache_dir or feature_cache_dir()
    path = folder / f"{EMBEDDER_ID}-{embedder_fingerprint()}-{texts_digest(list(texts))}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as npz:
                cached = np.asarray(npz["embeddings"], dtype=np.float32)
            if cached.shape == (len(texts), EMBEDDING_DIM):
                return cached
        except (OSError, ValueError, KeyError):
            pass  # a partial or foreign file: recompute below
    emb = embed_texts(texts, progress=progress)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, embeddings=emb)
    tmp.replace(path)
    return emb
