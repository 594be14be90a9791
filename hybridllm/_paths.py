"""Where hybridllm keeps its files. Read at call time, never at import (convention 7)."""

from __future__ import annotations

import os
from pathlib import Path

from ._exceptions import HybridLLMError


class BrokenInstallError(HybridLLMError, FileNotFoundError):
    """A file that hybridllm ships in its wheel (``hybridllm/_data``) is missing: the install is
    incomplete. A FileNotFoundError too, for code that caught that before."""


def _absolute(folder: str) -> Path:
    """A folder from the environment, ``~`` expanded and made absolute: a relative one
    (HYBRIDLLM_HOME=models) is the same folder it was (the current one's), but the paths built on it
    (``hybridllm models path``, a loaded model's file, errors) name it whole, not relative to a
    working folder that may have changed by the time they are used."""
    return Path(folder).expanduser().absolute()


def data_dir() -> Path:
    """Model files and exported embedders: $HYBRIDLLM_HOME, else the platformdirs user data dir."""
    home = os.environ.get("HYBRIDLLM_HOME")
    if home:
        return _absolute(home)
    import platformdirs

    return Path(platformdirs.user_data_dir("hybridllm", appauthor=False))


def cache_dir() -> Path:
    """The semantic cache database and the engine's compiled CPU kernels: $HYBRIDLLM_CACHE_DIR, else
    the platformdirs user cache dir."""
    override = os.environ.get("HYBRIDLLM_CACHE_DIR")
    if override:
        return _absolute(override)
    home = os.environ.get("HYBRIDLLM_HOME")
    if home:
        return _absolute(home) / "cache"
    import platformdirs

    return Path(platformdirs.user_cache_dir("hybridllm", appauthor=False))


def assets_dir() -> Path:
    """The shipped catalog and small trained artifacts: the package data folder ``hybridllm/_data``.

    Found through the package (``importlib.resources``), so it is the same folder in a checkout, an
    editable install and a wheel. A zipped install would need ``as_file``; hybridllm is never zip-safe.
    """
    from importlib.resources import files

    folder = Path(str(files("hybridllm") / "_data"))
    if not (folder / "catalog.json").is_file():
        raise BrokenInstallError(
            f"This hybridllm install is incomplete: its model catalog {folder / 'catalog.json'} is "
            "missing. Reinstall hybridllm (`pip install --force-reinstall --no-deps` the wheel or "
            "package you installed it from)."
        )
    return folder


def shipped_file(name: str) -> Path:
    """A file hybridllm ships in ``_data`` (the cache verifier, the reranker), or
    :class:`BrokenInstallError` when the install lacks it."""
    path = assets_dir() / name
    if not path.is_file():
        raise BrokenInstallError(
            f"This hybridllm install is incomplete: {path} is missing. Reinstall hybridllm "
            "(`pip install --force-reinstall --no-deps` the wheel or package you installed it from)."
        )
    return path
