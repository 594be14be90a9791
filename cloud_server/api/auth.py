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
    """Every key from the command line, the environment variable and the key file, deduplicated.

    A source given but empty is refused rather than read as "no key": ``--api-key "$KEY"`` or
    ``-e HYBRIDLLM_CLOUD_API_KEYS=$KEYS`` with the shell variable unset would otherwise start an
    open server."""
    cli_keys = list(cli_keys)
    if any(not key.strip() for key in cli_keys):
        raise ConfigError("--api-key got an empty key (an unset shell variable?); give the key, "
                          "or leave the option out for an open server")
    env = os.environ if environ is None else environ
    if API_KEYS_ENV in env and not any(key.strip() for key in env[API_KEYS_ENV].split(",")):
        raise ConfigError(f"{API_KEYS_ENV} is set but holds no key; set it to comma-separated "
                          "keys, or unset it for an open server")
    return _auth.load_api_keys(cli_keys, key_file, env, env_var=API_KEYS_ENV, error=ConfigError)
