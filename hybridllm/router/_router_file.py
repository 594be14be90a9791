"""The router folder's file format: its names and versions, and the checks that read router.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._exceptions import RouterFileError
from .features import EMBEDDER_ID, TEXT_FEATURES

FORMAT = "hybridllm-router"
FORMAT_VERSION = 2  # one gain scorer; version 1 routers have no topic part and still score the same
MIXTURE_FORMAT_VERSION = 3  # a source mixture (several training files): older versions refuse it
READABLE_VERSIONS = (1, 2, 3)
CLASSIFIER = "gain-logistic-knn-topics"
MIXTURE_CLASSIFIER = "source-mixture"
READABLE_CLASSIFIERS = ("gain-logistic-knn", CLASSIFIER, MIXTURE_CLASSIFIER)
CONFIG_NAME = "router.json"
WEIGHTS_NAME = "weights.npz"
TRAIN_HASHES = "train_prompt_hashes"  # in weights.npz; older readers ignore arrays they do not know


_RESERVED = {"format", "format_version", "classifier", "text_features", "embedding", "threshold",
             "logprob_threshold", "save_id"}


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_NAME
    if not path.is_file():
        raise RouterFileError(
            f"No {CONFIG_NAME} in {folder}; pass a folder written by `hybridllm router train`."
        )
    try:
        # utf-8-sig: a file hand-edited where editors save a byte-order mark (Windows Notepad,
        # PowerShell 5) was refused as corrupt
        config = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RouterFileError(f"{path} is corrupt ({exc}); retrain or re-copy the router.") from exc
    except OSError as exc:  # permission denied: else a bare OSError, not the library's error
        raise RouterFileError(f"{path} cannot be read ({exc}).") from exc
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise RouterFileError(f"{path} is not a hybridllm router file.")
    version = config.get("format_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:  # true == 1 in Python
        raise RouterFileError(
            f"{path} has format version {version!r}; this hybridllm reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}. Retrain it with `hybridllm router train` "
            "or upgrade hybridllm."
        )
    if config.get("classifier") not in READABLE_CLASSIFIERS:
        raise RouterFileError(f"{path} names an unknown classifier {config.get('classifier')!r}.")
    if config.get("text_features") != list(TEXT_FEATURES):
        raise RouterFileError(
            f"{path} was trained on other text features than this version computes; retrain it."
        )
    if "embedding" not in config:  # every save writes it (null: no embedding)
        raise RouterFileError(
            f"{path} has no 'embedding' field; set it to {EMBEDDER_ID!r} (or null for a router "
            "trained with --no-embedding), or re-copy the router."
        )
    if config.get("embedding") not in (None, EMBEDDER_ID):
        raise RouterFileError(f"{path} needs embedder {config.get('embedding')!r}; retrain it.")
    return config


def _number_field(config: dict[str, Any], name: str, path: Path, want: str,
                  ok: Callable[[float], bool], *, default: float | None = None) -> float:
    """``config[name]`` as a float, or a :class:`RouterFileError` naming ``path`` and the field:
    a JSON number only (``true`` or ``"0.5"`` in a hand-edited file is refused, not converted)."""
    value = config.get(name, default)
    if value is None or isinstance(value, bool) or not isinstance(value, int | float) \
            or not ok(float(value)):
        shown = "missing" if name not in config else json.dumps(value)[:80]
        raise RouterFileError(
            f"{path} has no valid {name}: {name!r} is {shown}; set it to {want}, or re-copy the router."
        )
    return float(value)
