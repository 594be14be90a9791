"""The catalog of embedded models (``hybridllm/_data/catalog.json``, found through the package)."""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from .._exceptions import ModelNotFoundError
from .._paths import BrokenInstallError, assets_dir


@dataclass(frozen=True)
class FileSpec:
    name: str  # path relative to the model's folder
    sha256: str
    size: int | None


@dataclass(frozen=True)
class ModelSpec:
    id: str
    kind: str  # "gguf" or "embedding"
    description: str
    package: str
    package_version: str
    pip: str  # the command that installs the package
    source: dict[str, Any]
    files: tuple[FileSpec, ...]
    license: str
    architecture: str
    chat_format: str | None  # "template" (own chat template), "completion" (base model) or None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def main_file(self) -> FileSpec:
        return self.files[0]

    @property
    def total_size(self) -> int | None:
        sizes = [f.size for f in self.files]
        return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)


@lru_cache(maxsize=1)
def load_catalog() -> dict[str, ModelSpec]:
    path = assets_dir() / "catalog.json"
    try:
        return _parse_catalog(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # a damaged shipped file: the user can only reinstall, so say so (not a raw JSONDecodeError)
        why = f"no field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise BrokenInstallError(
            f"This hybridllm install is damaged: its model catalog {path} is unreadable ({why}). "
            "Reinstall hybridllm (`pip install --force-reinstall --no-deps` the wheel or package you "
            "installed it from)."
        ) from exc


def _parse_catalog(raw: Any) -> dict[str, ModelSpec]:
    specs: dict[str, ModelSpec] = {}
    known = set(ModelSpec.__dataclass_fields__) - {"files", "extra"}
    for entry in raw["models"]:
        missing = sorted(k for k in known | {"files"} if k not in entry)
        if missing:  # a field left out: the spec would carry None where the store needs a value
            raise ValueError(f"no field {', '.join(missing)} in the entry {entry.get('id', '?')!r}")
        files = tuple(
            FileSpec(name, meta["sha256"], meta.get("size")) for name, meta in entry["files"].items()
        )
        if not files or not isinstance(entry["id"], str):
            raise ValueError(f"the entry {entry['id']!r} has no files or a non-text id")
        _check_numbers(entry)
        specs[entry["id"]] = ModelSpec(
            files=files,
            extra={k: v for k, v in entry.items() if k not in known and k != "files"},
            **{k: entry[k] for k in known},
        )
    return specs


# Counts the code uses as ints (a size in bytes compared with a file's, a range() bound): a whole
# number, not a bool (JSON true), a text "12", NaN or 1e999 (Python's json reads both as floats).
# The fields checked so are named: files[*].size, these, and a parts source's count (every number
# the schema has today); another field's number may be below 0 (a score, an offset, a bias).
_COUNTS = {"context_length": 1, "dimensions": 1}  # field -> its least value


def _check_numbers(entry: dict[str, Any]) -> None:
    """Refuse an entry whose sizes and counts (the fields named above) are not whole numbers in
    range, or any other number in it that is not finite; the error names the entry and the field."""
    mid = entry["id"]

    def count(value: Any, where: str, least: int = 0) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"the entry {mid!r} has {where} = {_shown(value)}; it must be a whole "
                             f"number, {least} or more")

    for name, meta in entry["files"].items():
        if meta.get("size") is not None:  # null: size unknown, measured from the source
            count(meta["size"], f"files[{name!r}].size")
    for key, least in _COUNTS.items():
        if key in entry:
            count(entry[key], key, least)
    if isinstance(entry["source"], dict) and "count" in entry["source"]:
        count(entry["source"]["count"], "source.count", 1)

    def other(value: Any, where: str) -> None:  # any number: finite (no JSON has NaN), any sign
        if isinstance(value, dict):
            for k, v in value.items():
                other(v, f"{where}.{k}" if where else str(k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                other(v, f"{where}[{i}]")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"the entry {mid!r} has {where} = {_shown(value)}; it must be a finite "
                             "number")

    other(entry, "")


def _shown(value: Any) -> str:
    """A catalog value as the JSON file spells it (NaN, Infinity, true, "12")."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return json.dumps(value)


def find_spec(model_id: str) -> ModelSpec | None:
    """The catalog entry for ``model_id``, or None. Matched as Ollama matches names: case aside,
    and spaces around a pasted id aside (``"SmolLM2-135M-Instruct "`` is ``smollm2-135m-instruct``)."""
    catalog = load_catalog()
    if model_id in catalog:
        return catalog[model_id]
    if not isinstance(model_id, str):
        return None
    key = model_id.strip().casefold()
    return next((spec for mid, spec in catalog.items() if mid.casefold() == key), None)


def did_you_mean(model_id: str) -> str:
    """The end of an unknown-id error for a typo or a short form of catalog ids: the ids it starts,
    else the closest spellings (`` Did you mean 'smollm2-135m-instruct'?``); "" when none is near."""
    if not isinstance(model_id, str) or not model_id.strip():
        return ""
    key = model_id.strip().casefold()
    ids = sorted(load_catalog())
    near = [mid for mid in ids if mid.casefold().startswith(key)] or difflib.get_close_matches(
        key, ids, n=3, cutoff=0.6)
    return f" Did you mean {' or '.join(repr(mid) for mid in near[:3])}?" if near else ""


def get_spec(model_id: str) -> ModelSpec:
    spec = find_spec(model_id)
    if spec is None:
        raise ModelNotFoundError(
            f"Unknown model {model_id!r}. Known models: {', '.join(sorted(load_catalog()))}; "
            f"or pass the path to a local .gguf file. See `hybridllm models list`.{did_you_mean(model_id)}"
        )
    return spec
