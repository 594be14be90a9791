"""Reading what the cloud answered: one event of a stream, a whole (non-streamed) completion, their
usage, the model they name and their finish_reason, each in OpenAI's shape or a retryable error.
The stream they come in is read by ``cloud_stream.py``.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from .._tools import CallsReader, ToolCallDelta
from .._types import (
    MAX_MODEL_CHARS,  # the longest model name an answer may report, as a request may give
    Usage,
)
from .base import Delta
from .cloud_status import _Retryable

log = logging.getLogger("hybridllm.cloud")


def _read_event(
    event: dict, calls: CallsReader | None = None
) -> tuple[list[str], str | None, Usage | None, list[ToolCallDelta]]:
    """(texts, finish reason, usage, tool-call pieces) of one stream event, the pieces read by
    ``calls`` (the answer's calls so far); TypeError, ValueError or AttributeError when it is not
    shaped as OpenAI's chunk."""
    usage = _usage_of(event["usage"]) if event.get("usage") else None
    texts, finish, pieces = [], None, []
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("tool_calls") and calls is not None:
            pieces += calls.feed(delta["tool_calls"])
        # a model that refuses sends its words as "refusal" (OpenAI), content null: they are the
        # answer's text (there is no refusal field to carry them; before, the answer read as "")
        for key in ("content", "refusal"):
            text = delta.get(key) or ""
            if not isinstance(text, str):
                raise TypeError(f"{key} is {type(text).__name__}, not text")
            if text:
                texts.append(text)
        if choice.get("finish_reason"):
            finish = str(choice["finish_reason"])
    return texts, finish, usage, pieces


def _model_of(body: object) -> str | None:
    """The model an answer or chunk names (``model``), when it is a name: a non-blank, printable
    string of at most ``MAX_MODEL_CHARS``; else None (a server that leaves it out, sends "" or
    garbage: the requested or discovered name stands)."""
    name = body.get("model") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_MODEL_CHARS or not name.isprintable():
        return None
    return name


def _count(value: object) -> int | None:
    """A token count: a whole number >= 0 (12, 12.0 or "12", as before), else None."""
    if isinstance(value, bool):
        return None
    try:
        n = int(value)  # type: ignore[call-overload]
        whole = isinstance(value, int) or float(value) == n  # type: ignore[arg-type]  # not 12.5
    except (TypeError, ValueError, OverflowError):  # null, "abc", NaN, Infinity, a list
        return None
    return n if whole and n >= 0 else None


def _usage_of(u: object) -> Usage | None:
    """The cloud's count of an answer, or None when it is not OpenAI's shape (a string, a null or
    negative count): ignored with a warning, so the pipeline estimates the call's tokens. Before,
    such a count failed an answer that had come whole (the device then appended to it) or had a
    negative count cut the call's cost."""
    counts = (
        [_count(u.get(k, 0)) for k in ("prompt_tokens", "completion_tokens")]
        if isinstance(u, dict)
        else [None]
    )
    if None in counts:
        log.warning(
            "the cloud sent a token count that is not whole numbers (%s); it is ignored and "
            "the call's tokens are estimated",
            repr(u)[:120],
        )
        return None
    usage = Usage(*counts)  # type: ignore[arg-type]
    assert isinstance(u, dict)  # (counts came from it)
    energy = u.get("energy")  # our server's extension (cloud_server.energy)
    joules = energy.get("joules") if isinstance(energy, dict) else None
    if isinstance(joules, int | float) and not isinstance(joules, bool) and 0 <= joules < math.inf:
        usage.energy_j = float(joules)
        usage.energy_source = str(energy.get("source") or "server")  # type: ignore[union-attr]
    return usage


def _read_completion(resp: Any, where: str) -> tuple[Delta, Delta]:
    """The text and the final delta of a whole (non-streamed) chat completion."""
    try:
        body = resp.json()
        if body.get("error"):
            raise _Retryable(f"the cloud reported an error: {str(body['error'])[:200]}")
        choice = body["choices"][0]
        message = choice.get("message") or {}
        text = message.get("content") or ""
        if not text:  # a refused answer: content null, the words in "refusal" (as streamed above)
            text = message.get("refusal") or ""
        if not isinstance(text, str):
            raise TypeError(f"content is {type(text).__name__}, not text")
        usage = _read_event({"usage": body.get("usage")})[2]
        calls = CallsReader()
        if message.get("tool_calls"):  # whole calls: each its own piece, numbered in order
            calls.feed(
                [
                    {**call, "index": i} if isinstance(call, dict) else call
                    for i, call in enumerate(message["tool_calls"])
                ]
            )
            calls.calls()  # (a call without a name is malformed)
    except (ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        raise _Retryable(f"malformed answer from {where}: {resp.text[:80]!r}") from exc
    served = _model_of(body)
    pieces = [c.as_delta(i) for i, c in enumerate(calls.calls())]
    return (
        Delta(text, model=served, tool_calls=pieces or None),
        Delta(
            "",
            finish_reason=_finish_reason(choice.get("finish_reason"), calls=bool(calls)),
            usage=usage or Usage(),
            model=served,
        ),
    )


# finish_reasons of servers that are not quite OpenAI's, as LiteLLM reads them: cut by the length
# limit (Anthropic's and Gemini's "max_tokens", Mistral's "model_length": its context window), cut
# by a filter (Gemini's "SAFETY"); and an answer the server gave up on (vLLM's "abort", Mistral's
# "error"): not whole, so not passed off as one
LENGTH_WORDS = {"length", "max_tokens", "model_length"}
FILTER_WORDS = {"content_filter", "content_filtered", "safety"}
BROKEN_WORDS = {"abort", "error"}


def _finish_reason(said: object, *, calls: bool = False) -> str:
    """The answer's finish_reason: "length" and "content_filter" (a hosted cloud's filter cut the
    answer: it is not whole, so not cached, and the caller is told), under the words of the
    servers above too; any other ("tool_calls", "eos_token", none) is "stop". An answer the cloud
    gave up on ("abort", "error") raises, as a stream that broke off. Before, a filtered answer
    read as "stop", was stored in the semantic cache and replayed as whole (and a cut or aborted
    one from a server with its own words still was)."""
    word = str(said).lower() if said else ""
    if word in BROKEN_WORDS:
        raise _Retryable(f"the cloud gave up on the answer (finish_reason {str(said)[:40]!r})")
    if calls and word in ("tool_calls", "function_call"):  # an answer that calls tools says so
        return "tool_calls"
    return "length" if word in LENGTH_WORDS else "content_filter" if word in FILTER_WORDS else "stop"


def _not_events(text: str) -> str:
    """What a stream that sent no event sent instead, for its error: the error of a JSON body
    (HTTP 200 with an error, under an event stream's content type or none), else its start."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("error"):
        return f": it sent no event but an error: {str(body['error'])[:200]}"
    start = " ".join(text.split())[:80]
    return f": it sent no event but {start!r} (is cloud_url an OpenAI-compatible server?)" if start else ""
