"""Embeddings of whole prompt lists kept on disk for training and evaluation (build code).

Embedding ten thousand prompts takes minutes on two cores, so :func:`cached_embeddings` writes them
to an ``.npz`` keyed by content: the embedder's ONNX file hash and the texts' digest. Each file also
holds a hash of every text, so a list that grew (labels appended by ``router label --out`` resuming,
a file with a few rows edited, a subset of another file) embeds only the texts no file holds, and a
file whose texts are all in the new one is removed. The folder is ``$HYBRIDLLM_EMBEDDINGS_DIR``,
else ``data_dir()/router_features/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .._files import DAMAGED_NPZ_ERRORS
from .._paths import data_dir, env_folder
from .dataset import texts_digest
from .features import EMBEDDER_ID, EMBEDDING_DIM, embed_texts


def embedder_fingerprint() -> str:
    """A short hash of the embedder's ONNX file: cached embeddings are only reused with it."""
    from ..cache.embedder import get_embedder

    return get_embedder().fingerprint


def feature_cache_dir() -> Path:
    """Where :func:`cached_embeddings` keeps its files: ``$HYBRIDLLM_EMBEDDINGS_DIR``, else the data dir.

    The files are keyed by content (embedder file hash and texts digest), so a folder may be shared
    by data dirs: the test suite keeps one outside its empty per-session data dir.
    """
    override = env_folder("HYBRIDLLM_EMBEDDINGS_DIR")  # made absolute once, as HYBRIDLLM_HOME
    return override if override is not None else data_dir() / "router_features"


def cached_embeddings(
    texts: Sequence[str],
    *,
    cache_dir: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Embeddings of ``texts``, read from or written to an ``.npz`` keyed by their content hash
    (``progress(done, total)`` while embedding what no cached file holds)."""
    folder = cache_dir or feature_cache_dir()
    # "single": each text embedded alone, as at run time (files from batched embedding are not read)
    fingerprint = embedder_fingerprint()
    prefix = f"{EMBEDDER_ID}-{fingerprint}-single-"
    path = folder / f"{prefix}{texts_digest(list(texts))}.npz"
    cached = _read(path)
    keys = _text_keys(texts)
    # the file's own text hashes must be these texts', row for row: the digest joins the texts
    # with NUL, so ["a\0b", ""] and ["a", "b\0"] share a name, and a copied or renamed file
    # would hand back another list's vectors
    if (
        cached is not None
        and cached[0].shape == (len(texts), EMBEDDING_DIM)
        and (cached[1] is None or np.array_equal(cached[1], keys))
    ):
        return cached[0]
    emb = np.zeros((len(texts), EMBEDDING_DIM), dtype=np.float32)
    missing, covered = _fill_from_other_files(folder, prefix, keys, emb, skip=path)
    if len(missing):
        emb[missing] = embed_texts([texts[i] for i in missing], progress=progress)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")  # two processes never share one
    try:
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(tmp, embeddings=emb, keys=keys)
        tmp.replace(path)
    except OSError as exc:  # a full disk, a read-only folder: the vectors are right, only not kept
        warnings.warn(
            f"Could not keep the prompt embeddings in {folder} ({exc}); the next run embeds them again.",
            RuntimeWarning,
            stacklevel=2,
        )
        return emb
    finally:  # also on Ctrl-C: no partial file left (readers skip them, but they fill the disk)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    stale = [f for f in folder.glob(f"{EMBEDDER_ID}-{fingerprint}-*.npz") if not f.name.startswith(prefix)]
    # every vector of ``covered`` is in the new file (a list that grew keeps one file); ``stale``
    # files hold batched vectors, never read again
    for old in [*covered, *stale]:
        with contextlib.suppress(OSError):  # another user's file in a shared folder: left alone
            old.unlink(missing_ok=True)
    return emb


def _text_keys(texts: Sequence[str]) -> np.ndarray:
    """``[n]`` 16-byte hashes of the texts (``S16``: saved without pickle)."""
    return np.array(
        [hashlib.sha256(t.encode("utf-8", "surrogatepass")).digest()[:16] for t in texts], dtype="S16"
    )


def _read(path: Path) -> tuple[np.ndarray, np.ndarray | None] | None:
    """A cache file's embeddings and text hashes (None for files written before them), or None
    when it is missing, partial or foreign."""
    if not path.is_file():
        return None
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a bare .npy array under the name
            return None
        with loaded as npz:
            emb = np.asarray(npz["embeddings"], dtype=np.float32)
            keys = np.asarray(npz["keys"]) if "keys" in npz.files else None
    except DAMAGED_NPZ_ERRORS:
        return None
    if emb.ndim != 2 or emb.shape[1] != EMBEDDING_DIM or not np.all(np.isfinite(emb)):
        return None  # the embedder's vectors are finite: a NaN would train the router on NaN
    if keys is not None and (keys.shape != (len(emb),) or keys.dtype != np.dtype("S16")):
        return None  # other hashes match no text (and [n, 2] ones were unhashable rows)
    return emb, keys


def _fill_from_other_files(
    folder: Path, prefix: str, keys: np.ndarray, emb: np.ndarray, *, skip: Path
) -> tuple[np.ndarray, list[Path]]:
    """Copy into ``emb`` the rows other cache files of this embedder hold (newest file first);
    return the indices still missing, and the files read whose texts are all in ``keys``."""
    want: dict[bytes, list[int]] = {}
    for i, k in enumerate(keys.tolist()):
        want.setdefault(k, []).append(i)
    found = folder.glob(f"{prefix}*.npz") if folder.is_dir() else []
    # newest first; not a ".tmp.npz" (another process's file still being written), nor ``skip``,
    # the file about to be written (another process may have written it meanwhile)
    others = (f for f in found if not f.name.endswith(".tmp.npz") and f != skip)
    files = sorted(others, key=_mtime, reverse=True)
    wanted = set(want)
    covered = []
    for f in files:
        if not want:
            break
        got = _read(f)
        if got is None or got[1] is None:
            continue
        theirs = got[1].tolist()
        for row, k in enumerate(theirs):
            rows = want.pop(k, None)
            if rows is not None:
                emb[rows] = got[0][row]
        if wanted.issuperset(theirs):
            covered.append(f)
    return np.array(sorted(i for rows in want.values() for i in rows), dtype=np.int64), covered


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile: read last (and skipped)
        return 0.0
