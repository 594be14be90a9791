"""Reading one answer: an event stream (SSE) or a whole JSON completion, its usage and finish_reason.

The stream and its lines are read here; each event, and a whole completion, by ``_cloud_answers.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AsyncExitStack, aclosing
from typing import TYPE_CHECKING, Any

from .._tools import CallsReader
from .._types import (
    MAX_MODEL_CHARS,  # noqa: F401 - re-exported: the longest model name an answer may report (tests)
    GenerationParams,
    Messages,
    Usage,
    estimate_text_tokens,
    estimate_tokens,
)
from ._cloud_answers import _finish_reason, _model_of, _not_events, _read_completion, _read_event
from .base import Delta, StopMatcher
from .circuit import Endpoint
from .cloud_http import MAX_ERROR_BYTES, _read_capped, _trickle_bound
from .cloud_request import _Requests
from .cloud_status import _EndpointDown, _Retryable

if TYPE_CHECKING:
    from .cloud_retry import CloudCallStream

log = logging.getLogger("hybridllm.cloud")
# the most of an answer held in memory: a server that sends without end (a runaway error page, an
# event stream with no line breaks) is cut off there, not read until the process runs out of memory
MAX_BODY_BYTES = 32 * 2**20  # a whole (non-streamed) completion
MAX_LINE_CHARS = 4 * 2**20  # one line of an event stream (one event: a token and its logprobs)


class _Streaming(_Requests):
    """The answer of one endpoint to :class:`~hybridllm.backends.cloud.CloudBackend`."""

    stall_timeout_s: float | None

    async def _stream_once(self, ep: Endpoint, messages: Messages, params: GenerationParams,
                           out: CloudCallStream | None = None) -> AsyncIterator[Delta]:
        """``out``: its ``request_out`` is set once the request goes out."""
        import httpx

        model = await self._resolve_model(ep)
        if out is not None:  # the prompt goes now (the model list before it carries none)
            out.request_out = True
        finish, usage = None, None
        done = False
        calls = CallsReader()  # the answer's tool calls, as their pieces come
        # the stop sequences of a model that refused them ('stop' left out): applied here, to what
        # the cloud sends, as the server would have: the answer ends before the earliest one
        matcher: StopMatcher | None = None
        tail = ""  # text let through once the stream is closed (what the matcher held at the end)
        # what the cloud sent, in tokens: each piece at least one (a server sends about one token an
        # event), else ~4 characters a token; the call's count when the stream is closed at a stop
        # sequence before the cloud's own count, sent last, arrives
        received = 0
        # the model the server says answered (each chunk's ``model``: OpenAI answers "gpt-4o" as
        # "gpt-4o-2024-08-06"), the first one named; None: the requested name stands (cloud_retry)
        served: str | None = None
        other = ""  # the start of what came that is no event (an error's JSON, a mislabelled body)
        try:
            async with AsyncExitStack() as stack:
                resp, sent = await self._post(ep, model, messages, params, stack)
                if params.stop and "stop" not in sent:
                    matcher = StopMatcher(tuple(params.stop))
                ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
                if ctype == "application/json":  # a server that ignores "stream": true
                    # bounded as a whole, as the head is: httpx's read timeout bounds each read, so
                    # a body that trickled in (a byte a second) held the request for days
                    async with _trickle_bound(2 * self.read_timeout_s,
                                              f"timeout talking to {ep.base_url}: no whole answer"):
                        resp, cut = await _read_capped(resp, MAX_BODY_BYTES)
                    if cut:
                        raise _Retryable(f"the answer from {ep.base_url} is over {MAX_BODY_BYTES >> 20} MiB "
                                         "(not an answer to this request; not read further)")
                    whole, final = _read_completion(resp, ep.base_url)
                    if matcher is not None:
                        text, hit = matcher.feed(whole.text)
                        whole = Delta(text if hit else text + matcher.flush(), model=whole.model)
                        if hit:  # the cloud's usage stays as it is: what it generated and bills
                            final.finish_reason = "stop"
                    if whole.text:
                        yield whole
                    yield final
                    return
                if ctype == "text/html":
                    raise _EndpointDown(f"{ep.base_url} answered a web page (text/html), not an event "
                                        "stream: is cloud_url the base URL of an OpenAI-compatible "
                                        "server? (a network's sign-in page does this too)", status=200,
                                        cause=f"a web page (text/html) from {ep.base_url}")
                # closed here, on this loop: left to the garbage collector, a stream broken off
                # mid-answer finalized after the loop had stopped ("Task was destroyed but it
                # is pending!" on stderr)
                lines = await stack.enter_async_context(aclosing(_lines(resp, ep.base_url)))
                # the longest wait for the next event: read_timeout_s until the first token, then
                # stall_timeout_s (read_timeout_s when that is None). Only events restart it: any
                # byte restarts httpx's read timeout, so a server that sent keepalive comments
                # (": ping") and no token held the call for ever
                quiet, stalls = self.read_timeout_s, False  # stalls: the stall timeout applies
                clock = asyncio.get_running_loop().time
                last_event = clock()
                pinged = False  # lines that are no event (keepalives) came since the last event
                events = False  # a "data:" line came: else what came is kept (its start) to say what it was
                # the event being read: its "data:" lines (an event's JSON may span several, joined
                # by line breaks as the SSE standard says) and its "event:" type ("error": its data
                # is the server's error, not a chunk)
                pending: list[str] = []
                pending_size, kind = 0, ""
                while True:
                    try:
                        line = await asyncio.wait_for(
                            anext(lines), None if quiet is None else last_event + quiet - clock())
                    except StopAsyncIteration:
                        if pending and finish is None:  # it ended in the middle of an event
                            data = "\n".join(pending)
                            if kind == "error":
                                raise _Retryable(f"the cloud reported an error mid-stream: "
                                                 f"{data[:200]}") from None
                            raise _Retryable(f"malformed event from {ep.base_url} (the stream ended in "
                                             f"it): {data[:80]!r}") from None
                        break
                    except TimeoutError:
                        if finish is not None:  # the answer is whole: only its count and [DONE] are late
                            break
                        if stalls:
                            raise _Retryable(f"the stream from {ep.base_url} stalled: no event for "
                                             f"{quiet:g} s") from None
                        raise _Retryable(f"timeout talking to {ep.base_url}: no event within {quiet:g} s "
                                         f"({'keepalives only' if pinged else 'ReadTimeout'})") from None
                    field, _, value = line.partition(":")
                    value = value.strip()
                    if field == "event":
                        kind = value
                    if field == "error" and value:  # llama.cpp's server: "error: {...}", no data line
                        pending, kind = [value], "error"
                    elif field == "data" and (value or pending):  # (an empty one alone: a keepalive)
                        pending.append(value)
                        pending_size += len(value)
                        if pending_size > MAX_LINE_CHARS:
                            raise _Retryable(f"the stream from {ep.base_url} sent an event over "
                                             f"{MAX_LINE_CHARS >> 20} M characters; not read further")
                    elif line or not pending:  # no event: a comment (": ping"), an id:, event: ...
                        kind = kind if line else ""  # a blank line ends the event, its type too
                        pinged = pinged or bool(line)
                        if not events and len(other) < MAX_ERROR_BYTES:
                            other += line[:MAX_ERROR_BYTES] + "\n"
                        continue
                    events, pinged = True, False
                    last_event = clock()
                    data = "\n".join(pending)
                    if data == "[DONE]":
                        done = True
                        break
                    try:
                        event: Any = json.loads(data)
                    except ValueError:
                        if field == "data":  # its JSON may go on in the next "data:" line
                            continue
                        event = None  # not JSON: an error event's text is its message
                    error_event = kind == "error"
                    pending, pending_size, kind = [], 0, ""
                    said = event.get("error") if isinstance(event, dict) else None
                    if error_event or said:  # OpenAI's {"error": {...}} chunk, or an error event
                        said = str(said or (data if event is None else event))[:200]
                        if finish is not None:  # the answer is whole already
                            log.info("the cloud at %s reported an error after the answer's end: %s",
                                     ep.base_url, said)
                            break
                        raise _Retryable(f"the cloud reported an error mid-stream: {said}")
                    try:
                        if event is None:
                            raise ValueError("not JSON")
                        texts, ended, counted, pieces = _read_event(event, calls)
                    except (ValueError, TypeError, AttributeError) as exc:  # not the OpenAI shape
                        if finish is not None:  # after the answer's end: it was shown whole already
                            log.info("ignored a malformed event from %s after the answer's end: %r",
                                     ep.base_url, data[:80])
                            break
                        raise _Retryable(f"malformed event from {ep.base_url}: {data[:80]!r}") from exc
                    usage = counted or usage
                    finish = ended or finish
                    served = served or _model_of(event)
                    hit = False
                    for text in texts:
                        if self.stall_timeout_s is not None:
                            quiet, stalls = self.stall_timeout_s, True
                        received += estimate_text_tokens(text)  # ~4 characters a token
                        if matcher is not None:
                            text, hit = matcher.feed(text)
                            if hit:
                                tail = text  # passed on once the stream is closed
                                break
                        if text:
                            paused = clock()
                            yield Delta(text, model=served)
                            # the time the reader held this piece is not the server's silence: a
                            # caller that paused longer than the stall timeout between two chunks
                            # (slow work per chunk, a slow client of hybridllm serve) had a healthy
                            # answer broken off, finished by the device and counted as a failure
                            # of the endpoint, the rest of it already waiting in the socket
                            last_event += clock() - paused
                    if pieces and not hit:
                        received += sum(estimate_text_tokens(p.arguments) for p in pieces) or 1
                        paused = clock()
                        yield Delta("", model=served, tool_calls=pieces)
                        last_event += clock() - paused
                    if hit:
                        # a stop sequence: the answer is over for the caller. The stream is closed
                        # now (leaving the block), not read to its end, so the cloud's count, sent
                        # last, does not come: the call is counted from what the cloud sent, the
                        # text past the stop included (the prompt estimated, ~4 characters a
                        # token), short only of what it generated after this event before it saw
                        # the connection close
                        finish, done = "stop", True
                        if usage is None:
                            usage = Usage(estimate_tokens(messages), received)
                        break
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise self._unreachable(ep, exc) from exc
        except (httpx.TransportError, httpx.DecodingError) as exc:
            # DecodingError: a body its content-encoding cannot decode (a proxy's broken gzip): it
            # escaped as httpx's own error, a traceback, not an answer from the device
            if finish is None:
                what = ("timeout talking to" if isinstance(exc, httpx.TimeoutException)
                        else "an undecodable answer from" if isinstance(exc, httpx.DecodingError)
                        else "cannot reach")
                raise _Retryable(f"{what} {ep.base_url} ({type(exc).__name__})") from exc
            # the connection broke after the answer's finish_reason (before its count or [DONE]): the
            # answer is whole and was shown; failing it would have the device append to it
            log.info("the stream from %s broke after the answer's end (%s)", ep.base_url,
                     type(exc).__name__)
        if not done and finish is None:
            # the connection closed cleanly in the middle of the answer: never pass off a
            # truncated answer as finished
            raise _Retryable(f"the stream from {ep.base_url} ended before the answer did"
                             + _not_events(other))
        if matcher is not None:  # the end of an answer with no stop sequence: what was held back
            tail += matcher.flush()
        if tail:
            yield Delta(tail, model=served)
        if calls:
            try:
                calls.calls()
            except ValueError as exc:  # a call whose name never came: not a whole answer
                raise _Retryable(f"malformed tool call from {ep.base_url}: {exc}") from None
        yield Delta("", finish_reason=_finish_reason(finish, calls=bool(calls)), usage=usage or Usage(),
                    model=served)


async def _lines(resp: Any, where: str) -> AsyncGenerator[str, None]:
    """The lines of an event stream (ended by LF, CRLF or CR), like httpx's ``aiter_lines`` but
    with a bound: a line over ``MAX_LINE_CHARS`` (a server that sends without line breaks) raises
    instead of growing until memory runs out. A CRLF split between two reads is one line end (an
    empty line more would end an event whose JSON goes on in its next "data:" line)."""
    pending: list[str] = []  # the start of a line not ended yet
    size = 0
    after_cr = False  # the last read ended in CR: an LF first in the next ends no other line
    async with aclosing(resp.aiter_text()) as texts:
        async for text in texts:
            if after_cr and text.startswith("\n"):
                text, after_cr = text[1:], False
            if text:
                after_cr = text.endswith("\r")
            *ended, rest = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
            for line in ended:
                yield "".join(pending) + line
                pending, size = [], 0
            pending.append(rest)
            size += len(rest)
            if size > MAX_LINE_CHARS:
                raise _Retryable(f"the stream from {where} sent a line over {MAX_LINE_CHARS >> 20} M "
                                 "characters (not an event stream); not read further")
    if last := "".join(pending):
        yield last
