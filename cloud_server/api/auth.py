"""API keys of the cloud server: the shared check (``hybridllm.wire.auth``) with this server's
exception types and environment variable, ``HYBRIDLLM_CLOUD_API_KEYS`` (comma-separated)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from cloud_server.exceptions import AuthError, ConfigError
from hybridllm.wire import auth as _auth

API_KEYS_ENV = "HYBRIDLLM_CLOUD_API_KEYS"


class ApiKeyChecker(_auth.ApiKeyChecker):
    def __init__(self, keys: Iterable[str]) -> None:
        super().__init__(keys, error=AuthError)


def load_api_keys(
    cli_keys: Iterable[str] = (),
    key_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """Every key from the command line, the environment variable and the key file, deduplicated."""
    return _auth.load_api_keys(cli_keys, key_file, environ, env_var=API_KEYS_ENV, error=ConfigError)
