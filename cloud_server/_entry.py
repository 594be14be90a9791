"""The entry of the cloud server's command, shared by ``hybridllm-cloud`` (``hybridllm.cli.cloud_main``)
and ``python -m cloud_server``: the [server] extra is checked first, so that without it the command
prints one line naming the extra instead of the traceback of an import (pydantic, FastAPI, torch).
Nothing of the extra is imported here."""

from __future__ import annotations

import os
import sys

PROG = "hybridllm-cloud"
# the command's own modules (cloud_server/__main__.py imports them), imported by check_extra
CLI_MODULES = ("cloud_server.cli_checks", "cloud_server.cli_parser", "cloud_server.cli_settings")


def check_extra() -> int | None:
    """None when the command can run; else its exit status (1), its one line printed on stderr."""
    from hybridllm.cli import missing_server_module

    # checked by name first: the [proxy] extra brings FastAPI and pydantic, so the command's own
    # modules import, and torch or prometheus_client is found missing only when serving starts
    missing = missing_server_module()
    if missing is not None:
        return _say_missing(missing)
    try:
        for name in CLI_MODULES:
            __import__(name)
    except ModuleNotFoundError as exc:
        return _not_found(exc)
    return None


def main() -> int:
    """``hybridllm-cloud``: the extra checked, then the command (``cloud_server/__main__.py``, imported
    by name here; ``python -m cloud_server`` runs that file as ``__main__`` and calls check_extra)."""
    code = check_extra()
    if code is not None:
        return code
    try:
        from cloud_server.__main__ import main as cloud
    except ModuleNotFoundError as exc:
        return _not_found(exc)
    return cloud()


def _not_found(exc: ModuleNotFoundError) -> int:
    # a module of hybridllm or cloud_server itself missing is a broken install, not the extra
    if (exc.name or "").split(".")[0] in ("hybridllm", "cloud_server") or os.environ.get("HYBRIDLLM_DEBUG"):
        raise exc
    return _say_missing(exc.name)


def _say_missing(missing: str | None) -> int:
    from hybridllm.cli import server_extra_hint

    print(f"{PROG}: error: {server_extra_hint(missing)}", file=sys.stderr)
    return 1
