"""Where hybridllm keeps its files. Read at call time, never at import (convention 7)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ._exceptions import ConfigError, HybridLLMError


class BrokenInstallError(HybridLLMError, FileNotFoundError):
    """A file that hybridllm ships in its wheel (``hybridllm/_data``) is missing: the install is
    incomplete. A FileNotFoundError too, for code that caught that before."""


class PathSettingError(ConfigError, OSError):
    """A path setting (HYBRIDLLM_HOME, HYBRIDLLM_CACHE_DIR, cache_path, ...) that cannot be used. An
    OSError too, so code that goes without a folder it cannot write (the cloud engine's weight cache
    and CPU kernels) still does."""


# (variable, value) -> the folder a relative value named when it was first read: resolved once, so a
# later os.chdir (an app moving to its own folder after the first client) leaves models pulled to
# one folder where they are looked for, and the cache in one file
_RESOLVED: dict[tuple[str, str], Path] = {}
_VAR_REF = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _absolute(folder: str, name: str) -> Path:
    """A folder from the environment, ``~`` expanded and made absolute: a relative one
    (HYBRIDLLM_HOME=models) is the current folder's when first read, and stays that folder for the
    process, so the paths built on it (``hybridllm models path``, a loaded model's file, errors)
    name it whole, not relative to a working folder that may have changed since.

    ``$VAR`` is not expanded (as HF_HOME and XDG's variables): a shell expands it, a .env file or a
    service's config does not, so ``$HOME/models`` that names a set variable is refused rather than
    made a folder literally named ``$HOME`` in the working folder."""
    known = _RESOLVED.get((name, folder))
    if known is not None:
        return known
    for match in _VAR_REF.finditer(folder):
        var = match.group(1) or match.group(2)
        if var in os.environ:
            raise PathSettingError(
                f"{name}={folder!r} holds ${var}, which hybridllm does not expand (a shell does, a "
                f".env file or a service's config does not); write it out: {os.path.expandvars(folder)!r}."
            )
    try:
        path = Path(folder).expanduser()
    except RuntimeError as exc:  # ~nosuchuser, or no home folder to expand ~ to
        raise PathSettingError(f"{name}={folder!r}: {exc}; write the path out in full.") from None
    if path.is_absolute():
        return path
    return _RESOLVED.setdefault((name, folder), path.absolute())


def setting_path(value: str | os.PathLike[str] | None, name: str) -> Path | None:
    """The path a setting ``name`` holds (see :func:`_absolute`), or None when it is unset or blank.
    The spaces around it are dropped (a .env line's trailing space made a folder "models " beside
    "models", a blank value a folder or file named " " in the working folder)."""
    raw = str(value if value is not None else "").strip()
    return _absolute(raw, name) if raw else None


def env_folder(name: str) -> Path | None:
    """The folder the environment variable ``name`` sets (:func:`setting_path`), or None when it is
    unset or blank; a file in its place is refused, naming the variable."""
    path = setting_path(os.environ.get(name), name)
    if path is not None and path.exists() and not path.is_dir():
        raise PathSettingError(f"{name}={os.environ[name]!r} names {path}, which is a file, not a "
                               f"folder; point {name} at a folder (it is created if missing).")
    return path


def data_dir() -> Path:
    """Model files and exported embedders: $HYBRIDLLM_HOME, else the platformdirs user data dir."""
    home = env_folder("HYBRIDLLM_HOME")
    if home is not None:
        return home
    import platformdirs

    return Path(platformdirs.user_data_dir("hybridllm", appauthor=False))


def cache_dir() -> Path:
    """The semantic cache database and the engine's compiled CPU kernels: $HYBRIDLLM_CACHE_DIR, else
    the platformdirs user cache dir."""
    override = env_folder("HYBRIDLLM_CACHE_DIR")
    if override is not None:
        return override
    home = env_folder("HYBRIDLLM_HOME")
    if home is not None:
        return home / "cache"
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
