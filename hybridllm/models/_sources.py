"""Where a catalog model's files come from: the installed PyPI packages that carry them."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
from pathlib import Path

from .._exceptions import ModelNotFoundError, ModelPackageMissingError
from .catalog import FileSpec, ModelSpec


def _package_root(spec: ModelSpec) -> Path:
    try:
        dist = importlib.metadata.distribution(spec.package)
    except importlib.metadata.PackageNotFoundError:
        raise ModelPackageMissingError(
            f"Model {spec.id!r} needs the package {spec.package!r}, which is not installed. "
            f"Install it with: {spec.pip}"
        ) from None
    return Path(str(dist.locate_file("")))


def _part_files(spec: ModelSpec) -> list[Path]:
    """``parts`` source: one package per piece (``package`` and ``path`` take ``{i}``, 1-based).

    Each piece is found through its distribution's metadata; nothing from these packages is
    imported or run, so a part package that declares odd dependencies or code is harmless.
    """
    src = spec.source
    parts, missing = [], []
    for i in range(1, int(src["count"]) + 1):
        name = src["package"].format(i=i)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        parts.append(Path(str(dist.locate_file(src["path"].format(i=i)))))
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ModelPackageMissingError(
            f"Model {spec.id!r} needs {len(missing)} part package(s) that are not installed "
            f"({shown}). Install them with: {spec.pip}"
        )
    return parts


def _source_parts(spec: ModelSpec, file: FileSpec) -> list[Path]:
    """The package files whose concatenation is ``file``."""
    src = spec.source
    if src["type"] == "parts":
        parts = _part_files(spec)
    elif src["type"] == "file":
        parts = [_package_root(spec) / src["path"]]
    elif src["type"] == "dir":
        parts = [_package_root(spec) / src["path"] / file.name]
    elif src["type"] == "chunks":
        _package_root(spec)  # a clear error when the package is missing
        try:
            module = importlib.import_module(src["module"])
            parts = [Path(p) for p in module.chunk_paths()]
        except (ImportError, AttributeError) as exc:  # a part package missing; another version
            raise ModelPackageMissingError(
                f"Model {spec.id!r}: a part package is missing or of another version ({exc})."
                f"{_version_note(spec)} Install it with: {spec.pip}"
            ) from exc
    else:  # pragma: no cover - catalog error
        raise ModelNotFoundError(f"Model {spec.id!r} has an unknown source type {src['type']!r}.")
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise ModelPackageMissingError(
            f"Model {spec.id!r}: files missing from the installed package: {', '.join(missing)}."
            f"{_version_note(spec)} Reinstall it with: {spec.pip} --force-reinstall"
        )
    return parts


def _version_note(spec: ModelSpec) -> str:
    """Which installed package is not the version the catalog names ("" when all are)."""
    src = spec.source
    names = ([src["package"].format(i=i) for i in range(1, int(src["count"]) + 1)]
             if src["type"] == "parts" else [spec.package])
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found = importlib.metadata.version(name)
            if found != spec.package_version:
                return (f" The installed {name} is version {found}; {spec.id!r} needs "
                        f"{spec.package_version}.")
    return ""
