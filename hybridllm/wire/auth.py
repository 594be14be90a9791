"""API keys for both servers: where they come from and how a request's key is checked.

Keys come from ``--api-key`` (repeatable; visible in ``ps``, so prefer the others), an environment
variable (comma-separated) and ``--api-key-file`` (one key per line, ``#`` comments). With no key
at all the server is open, which is only sensible on loopback.

The check hashes both sides with SHA-256 and compares the digests with ``hmac.compare_digest``
against every configured key without stopping at the first match, so the time taken depends
neither on how much of a key matched, nor on its length, nor on which key it was.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from .errors import WireError


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def unauthorized(message: str) -> Exception:
    return WireError(message, status=401, code="invalid_api_key")


class ApiKeyChecker:
    def __init__(self, keys: Iterable[str], *, error: Callable[[str], Exception] = unauthorized) -> None:
        self._digests = [_digest(k) for k in keys]
        self._error = error

    @property
    def is_enabled(self) -> bool:
        return bool(self._digests)

    def check(self, authorization: str | None) -> None:
        """Raise unless the ``Authorization`` header carries a configured key: the scheme in any
        case and any white space before the key (RFC 7235), and a 401 that says what is wrong: no
        key, no key after ``Bearer``, another scheme or the key sent bare (not "Incorrect API key":
        the key may be right), or a wrong key. The header's text is never quoted: it may be a key."""
        if not self._digests:
            return
        parts = (authorization or "").split(None, 1)
        if not parts:
            raise self._error(
                "You didn't provide an API key. Pass it in the Authorization header as 'Bearer YOUR_KEY'."
            )
        if parts[0].lower() != "bearer":
            raise self._error("The Authorization header must use the Bearer scheme: send it as "
                              "'Authorization: Bearer YOUR_KEY'.")
        if len(parts) < 2:
            raise self._error("The Authorization header holds no API key after 'Bearer': send it as "
                              "'Authorization: Bearer YOUR_KEY'.")
        given = _digest(parts[1].strip())
        matched = False
        for digest in self._digests:
            matched |= hmac.compare_digest(given, digest)
        if not matched:
            raise self._error("Incorrect API key provided.")


def load_api_keys(
    cli_keys: Iterable[str] = (),
    key_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    env_var: str,
    error: Callable[[str], Exception] = ValueError,
) -> list[str]:
    """Every key from the command line, ``env_var`` and the key file, deduplicated."""
    env = os.environ if environ is None else environ
    keys = [k.strip() for k in cli_keys]
    keys += [k.strip() for k in env.get(env_var, "").split(",")]
    if key_file is not None:
        path = Path(key_file)
        try:
            # utf-8-sig: a file saved by Windows Notepad starts with a BOM, not part of the first key
            lines = path.read_text(encoding="utf-8-sig").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise error(f"cannot read API key file {path}: {reason}") from exc
        keys += [line.strip() for line in lines if not line.lstrip().startswith("#")]
        if not any(line.strip() and not line.lstrip().startswith("#") for line in lines):
            raise error(f"API key file {path} holds no key")
    for key in keys:
        if any(ch.isspace() for ch in key):
            raise error("an API key must not contain whitespace")
        # a header value reaches the server as latin-1 text and is hashed as UTF-8 here, so a key
        # with a character past ASCII (or a control character) could never match: refused at start
        if not (key.isascii() and key.isprintable()):
            raise error("an API key must be printable ASCII (letters, digits, punctuation): HTTP "
                        "headers carry no other characters")
    return list(dict.fromkeys(k for k in keys if k))
