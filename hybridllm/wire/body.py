"""Read a request body with a size limit, decode it as strict JSON, and vet what JSON lets through.

Checks, in order, each an OpenAI-shaped 4xx:
- encoding: a ``Content-Encoding`` other than ``identity`` (a gzip body) is refused unread (400);
- size: ``Content-Length`` over the limit is refused before reading (413); a body that grows past
  it while streaming in is refused as soon as it does (413);
- time: a body not received whole within ``BODY_TIMEOUT_S`` (a client that trickles it, or announces
  a ``Content-Length`` and never sends it) is refused (408), as nginx and Node do: without a
  deadline it held a connection and a task for ever;
- JSON: UTF-8 (a body that is not is told so, not asked for valid JSON), no ``NaN``/``Infinity``
  literals, no key twice in one object, an object at the top (400);
- nesting deeper than ``MAX_DEPTH`` (400; the stdlib parser would raise ``RecursionError``);
- strings holding a lone UTF-16 surrogate (``"\\ud800"`` is valid JSON but no valid text: it
  cannot be encoded as UTF-8, so a tokenizer or a log line would fail on it later) (400).

Decoding a large body costs CPU: callers run ``decode_json_object`` in a worker thread when the
body is large (``is_large``) so the event loop keeps answering ``/health``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

from ..prompts import LONE_SURROGATE
from .errors import WireError, header_value

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 32
LARGE_BODY_BYTES = 64 * 1024
# the whole body, from the first read to the last: 4 MiB (the default limit) at ~70 kB/s
BODY_TIMEOUT_S = 60.0


class _Request(Protocol):  # the part of starlette's Request used here
    @property
    def headers(self) -> Any: ...

    def stream(self) -> Any: ...


def too_large(limit: int) -> WireError:
    return WireError(
        f"The request body is larger than this server accepts ({limit} bytes).",
        status=413,
        code="request_too_large",
    )


def too_slow(timeout_s: float) -> WireError:
    return WireError(
        f"The request body was not received within {timeout_s:g} seconds; send it whole, at once.",
        status=408,
        code="request_timeout",
    )


async def read_body(request: _Request, limit: int = DEFAULT_MAX_BODY_BYTES,
                    timeout_s: float | None = None) -> bytes:
    """The body, or ``WireError`` 413 as soon as it is known to exceed ``limit`` bytes, or 408 when
    it has not all come within ``timeout_s`` (``BODY_TIMEOUT_S`` by default)."""
    # The body is read as sent: a compressed one (gzip) was refused as "not valid JSON", which the
    # client had sent; say what is wrong instead (400 naming the header), before reading it.
    encoding = request.headers.get("content-encoding")
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        raise WireError(
            f"Content-Encoding {header_value(encoding, 40)!r} is not supported: send the JSON body "
            "uncompressed (no Content-Encoding header).", code="unsupported_content_encoding")
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise too_large(limit)
        except ValueError:
            raise WireError("Invalid Content-Length header.") from None
    timeout_s = BODY_TIMEOUT_S if timeout_s is None else timeout_s
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                chunks.append(chunk)
    except TimeoutError:
        raise too_slow(timeout_s) from None
    return b"".join(chunks)


def is_large(body: bytes) -> bool:
    return len(body) > LARGE_BODY_BYTES


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of a repeated key: {"messages": [...], "messages": [...]} silently lost
    # the first conversation (and a proxy in front may have checked the other one). A WireError
    # (no ValueError) passes through json.loads unchanged.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                shown = key if len(key) <= 40 else key[:40] + "..."
                raise WireError(f"The JSON body holds the key {shown!r} twice in one object; send "
                                "each key once.")
            seen.add(key)
    return obj


def decode_json_object(body: bytes) -> dict[str, Any]:
    """Strict JSON object from ``body``; ``WireError`` (400) on anything else."""
    try:
        # utf-8-sig: a leading byte order mark (PowerShell 5's and Notepad's UTF-8) is no part of
        # the JSON; RFC 8259 lets a parser ignore it, and json.loads(bytes) does, as do its peers
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        # "send valid JSON with Content-Type: application/json" misled a client that had (a Latin-1
        # or UTF-16 body): say what is wrong, and where
        at = exc.start + len(body) - len(exc.object)  # utf-8-sig reports past a byte order mark
        raise WireError(
            f"The request body is not valid UTF-8 (byte 0x{body[at]:02x} at offset {at}); JSON "
            "must be sent as UTF-8 (RFC 8259)."
        ) from None
    try:
        data = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise WireError(f"The JSON body is nested deeper than {MAX_DEPTH} levels.") from None
    except ValueError:
        raise WireError(
            "We could not parse the JSON body of your request. Send valid JSON with "
            "'Content-Type: application/json'."
        ) from None
    if not isinstance(data, dict):
        raise WireError("The request body must be a JSON object.")
    check_json_values(data)
    return data


def _path(parts: tuple[Any, ...]) -> str | None:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def check_json_values(data: Any) -> None:
    """Depth and lone-surrogate checks over decoded JSON, without recursion."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack:
        value, where = stack.pop()
        if len(where) > MAX_DEPTH:
            message = f"The JSON body is nested deeper than {MAX_DEPTH} levels."
            raise WireError(message, param=_path(where[:1]))
        if isinstance(value, str):
            if LONE_SURROGATE.search(value):
                raise WireError(
                    "A string holds a lone UTF-16 surrogate (such as \\ud800), which is not valid "
                    "text; send well-formed Unicode.",
                    param=_path(where),
                )
        elif isinstance(value, dict):
            for key, item in value.items():
                if LONE_SURROGATE.search(key):
                    raise WireError("An object key holds a lone UTF-16 surrogate.", param=_path(where))
                stack.append((item, (*where, key)))
        elif isinstance(value, list):
            stack.extend((item, (*where, i)) for i, item in enumerate(value))
