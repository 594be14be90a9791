"""Where the config file is (``--config``, ``HYBRIDLLM_CONFIG``, the user's config folder) and
reading it: a regular file of ``CONFIG_MAX_BYTES`` at most."""

from __future__ import annotations

import os
from pathlib import Path

from ._exceptions import ConfigError


def config_file_path(explicit: str | os.PathLike[str] | None) -> Path | None:
    if explicit:
        return Path(explicit).expanduser()
    if os.environ.get("HYBRIDLLM_CONFIG"):
        return Path(os.environ["HYBRIDLLM_CONFIG"]).expanduser()
    import platformdirs

    default = Path(platformdirs.user_config_dir("hybridllm", appauthor=False)) / "config.toml"
    return default if default.is_file() else None


# the largest config file read: every setting fits in a few KiB, with hundreds of cloud_endpoints a
# few hundred; a larger file is no config (a log, a model named by mistake) and was held in memory
CONFIG_MAX_BYTES = 1 << 20


def _read_config_file(path: Path) -> bytes:
    """The bytes of the config file ``path``: a regular file of CONFIG_MAX_BYTES at most. Before,
    ``/dev/zero`` was read until memory ran out and a FIFO with no writer blocked for ever."""
    import stat

    # non-blocking: opening a FIFO waits for a writer otherwise (a regular file ignores the flag);
    # FileNotFoundError, PermissionError: the caller's messages
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        st = os.fstat(fd)  # of what was opened: no race with a file replaced meanwhile
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"Config file {path} is a folder, not a file.")
        if not stat.S_ISREG(st.st_mode):
            if _is_devnull(st):  # HYBRIDLLM_CONFIG=/dev/null: no config file, as before
                return b""
            raise ConfigError(f"Config file {path} is not a regular file (a device, a pipe or a socket).")
        data = b""
        while len(data) <= CONFIG_MAX_BYTES:  # one byte more than the limit: refused, not cut
            chunk = os.read(fd, CONFIG_MAX_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) > CONFIG_MAX_BYTES:
        raise ConfigError(f"Config file {path} is over {CONFIG_MAX_BYTES >> 20} MiB: not a hybridllm "
                          "config (a few KiB hold every setting).")
    return data


def _is_devnull(st: os.stat_result) -> bool:
    try:
        return os.path.samestat(st, os.stat(os.devnull))
    except OSError:
        return False
