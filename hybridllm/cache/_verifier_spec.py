"""The semantic cache's ``verifier=`` setting: the names and files it accepts, loaded as a verifier."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from .._exceptions import CacheError, ConfigError
from .._files import DAMAGED_NPZ_ERRORS
from .reranker import FORMAT as RERANKER_FORMAT
from .reranker import RerankVerifier, get_rerank_verifier
from .verifier import HitVerifier

Verifier = HitVerifier | RerankVerifier
VERIFIER_CHOICES = ("default", "reranker", "features", "cosine")


def load_verifier(spec: str | Path) -> Verifier | None:
    """``"default"``/``"reranker"`` (the shipped cross-encoder), ``"features"`` (the shipped
    feature verifier), ``"cosine"`` (none), or the path of a reranker or feature-verifier file."""
    if spec in ("default", "reranker"):
        return get_rerank_verifier()
    if spec == "features":
        return HitVerifier.load()
    if spec == "cosine":
        return None
    path = Path(spec)
    try:
        with np.load(path, allow_pickle=False) as data:
            kind = str(data["format"]) if "format" in data.files else ""
    except DAMAGED_NPZ_ERRORS as exc:  # the file's fault, not ours
        raise ConfigError(
            f"Cache verifier {spec!r} is neither one of {VERIFIER_CHOICES} nor a readable file: {exc}"
        ) from exc
    if kind == RERANKER_FORMAT:
        return get_rerank_verifier(path)
    try:
        return HitVerifier.load(path)
    except CacheError as exc:
        # a member past the header damaged (HitVerifier.load says CacheError, naming the file): a
        # setting's fault here, as an unreadable file is above
        if isinstance(exc.__cause__, zipfile.BadZipFile | zlib.error | EOFError | NotImplementedError):
            raise ConfigError(
                f"Cache verifier {spec!r} is damaged ({exc.__cause__}): copy or train it again"
            ) from exc
        raise
