"""The CLI's terminal I/O: the usage error, styled stderr notes, argv/stdin text, the trace line."""

from __future__ import annotations

import os
import sys
from typing import Any

from ._exceptions import HybridLLMError


class _UsageError(HybridLLMError):
    """A command line that cannot work, found after parsing: exit status 2, like argparse's own."""


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):  # a closed, gone or stand-in stream
        return False


def _style(text: str, code: str, stream: Any = None) -> str:
    """``text`` in an ANSI style when ``stream`` (default stdout) is a terminal that takes colour:
    never into a pipe or file, nor under NO_COLOR (https://no-color.org) or TERM=dumb."""
    stream = sys.stdout if stream is None else stream
    if not _isatty(stream) or os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return text
    return f"\x1b[{code}m{text}\x1b[0m"


def _note(text: str) -> None:
    """A status line for the person at the terminal: dim, on stderr, so stdout holds only answers."""
    print(_style(text, "2", sys.stderr), file=sys.stderr, flush=True)


def _text(value: str) -> str:
    """Text from argv or stdin as well-formed Unicode: bytes that are not UTF-8 (which Python keeps
    as lone surrogates) become U+FFFD instead of failing the request."""
    try:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a lone surrogate that stands for no byte
        return value.encode("utf-8", "replace").decode("utf-8")


def _decode_stdin_leniently() -> None:
    reconfigure = getattr(sys.stdin, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(errors="surrogateescape")  # _text() then turns the bad bytes into U+FFFD
        except (ValueError, OSError):
            pass


def trace_line(c: Any) -> str:
    tps = f"{c.tokens_per_s:.0f} tok/s" if c.tokens_per_s else "- tok/s"
    ttft = f"TTFT {c.ttft_ms:.0f} ms" if c.ttft_ms is not None else "TTFT -"
    return (f"[{c.route} · {c.model} · {ttft} · {tps} · {c.usage.completion_tokens} tokens · "
            f"{c.reason}]")
