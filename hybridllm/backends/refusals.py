"""The request fields a hosted cloud refused, remembered across processes.

The cloud client learns per endpoint and model which fields the endpoint does not take (``top_k``
at a hosted OpenAI-compatible API, ``max_tokens``, ``temperature`` and ``stop`` at a reasoning
model: see ``cloud.py``), each by one refused POST. Kept in memory only, every process learned them
again: each ``hybridllm ask`` to a reasoning model paid up to five refused round trips before its
answer. This file keeps what was learned for ``TTL_S``, in the user cache dir, so the next process
sends its first request as the last one left off; after that the endpoint is asked again with the
fields (a server upgraded since may take them now).

Remembered only for ``https`` endpoints off this machine: a hosted API. A plain-http or local
server is one being developed or reconfigured, where a refusal is better learned anew each run.
The file holds endpoint URLs, model names and field names, never a key or a prompt. Unreadable
or corrupt, it is ignored (and replaced at the next refusal); unwritable, nothing is kept. Writers
(threads and processes) take turns under a lock (``.cloud_refused_fields.json.lock`` beside it).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

from .._files import atomic_write

log = logging.getLogger("hybridllm.cloud")
FILE_NAME = "cloud_refused_fields.json"
TTL_S = 7 * 86400.0  # then the endpoint is asked with the fields again
_VERSION = 1


def is_hosted(base_url: str) -> bool:
    """An https endpoint whose host is not this machine (not localhost, not a loopback address,
    not 0.0.0.0 or ``::``, which a client reaches as this machine)."""
    parts = urlsplit(base_url)
    host = (parts.hostname or "").lower().rstrip(".")  # "localhost." is the same name, rooted
    if parts.scheme != "https" or not host or host == "localhost" or host.endswith(".localhost"):
        return False
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:  # a name, not an address
        return True
    # ::ffff:127.0.0.1 is 127.0.0.1 written as IPv6 (Python before 3.13 calls it not loopback)
    addr = getattr(addr, "ipv4_mapped", None) or addr
    return not (addr.is_loopback or addr.is_unspecified)


class RefusalMemory:
    """``path``: the JSON file (``cache_dir() / FILE_NAME`` by default, resolved when first used)."""

    def __init__(self, path: Path | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._clock = clock

    @property
    def path(self) -> Path:
        if self._path is None:
            from .._paths import cache_dir

            self._path = cache_dir() / FILE_NAME
        return self._path

    def recall(self, base_url: str, model: str) -> tuple[frozenset[str], float] | None:
        """The fields ``base_url`` refused for ``model`` and when (epoch seconds), or None when
        nothing is remembered or it is older than ``TTL_S``."""
        entry = self._read().get(_key(base_url, model))
        if not isinstance(entry, dict):
            return None
        fields, at = entry.get("fields"), entry.get("at")
        if not isinstance(fields, list) or not isinstance(at, (int, float)) or isinstance(at, bool):
            return None
        if not fields or not 0 <= self._clock() - at < TTL_S:
            return None
        return frozenset(f for f in fields if isinstance(f, str)), float(at)

    def remember(self, base_url: str, model: str, fields: frozenset[str]) -> None:
        """Keep ``fields`` as what ``base_url`` refuses for ``model``, from now (entries past
        their time are dropped as the file is written)."""
        path = self.path
        # one writer at a time, threads (several clients in one process) and processes alike: the
        # file is read, added to and replaced under the lock, so no writer drops another's entry;
        # each write has a temporary of its own (one shared name let two writers mix their bytes
        # into one corrupt file, and every entry was lost with it), removed on any error
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with _LOCK, _file_lock(path.with_name(f".{path.name}.lock")):
                now = self._clock()
                entries = {k: v for k, v in self._read().items()
                           if isinstance(v, dict) and isinstance(v.get("at"), (int, float))
                           and 0 <= now - v["at"] < TTL_S}
                entries[_key(base_url, model)] = {"fields": sorted(fields), "at": now}
                text = json.dumps({"version": _VERSION, "entries": entries}, indent=1)
                # whole or not at all: a reader gets one or the other
                with atomic_write(path, "w", encoding="utf-8") as fh:
                    fh.write(text)
        except OSError as exc:
            log.debug("could not keep the cloud's refused fields in %s: %s", path, exc)

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:  # (arrays nested past the stack)
            log.debug("ignoring %s: %s", self.path, exc)
            return {}
        entries = data.get("entries") if isinstance(data, dict) and data.get("version") == _VERSION else None
        return entries if isinstance(entries, dict) else {}


_LOCK = threading.Lock()  # the writers of this process (flock alone does not order threads of one)


@contextlib.contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    """An exclusive lock between processes on ``lock_path`` (made if missing, left in place); where
    files cannot be locked (Windows, some network mounts) none is held, as before."""
    from .._locks import lock_exclusive

    with open(lock_path, "a") as fh:
        try:
            if not lock_exclusive(fh.fileno()):
                log.debug("no lock on %s: written without one", lock_path)
        except OSError as exc:
            log.debug("no lock on %s (%s): written without one", lock_path, exc)
        yield  # closing the file releases the lock


def _key(base_url: str, model: str) -> str:
    return f"{base_url} {model}"
