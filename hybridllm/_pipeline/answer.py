"""One answer being streamed: deltas in, chunks out, placeholders restored, stops matched."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from .._exceptions import CloudUnavailableError, EdgeError
from .._tool_answers import ToolCallReader
from .._tools import CallsReader, Function, ToolCall, ToolCallDelta
from .._types import Chunk, Completion, Usage, estimate_text_tokens
from ..backends.base import Backend, Delta, StopMatcher
from .accounting import checked_usage
from .request import _CloudCall

if TYPE_CHECKING:
    from ..router.privacy import Restorer

T = TypeVar("T")


class _RestoredStop:
    """A :class:`Restorer` whose output is cut at the caller's stop sequences: with
    privacy="redact" the cloud writes placeholders, and a stop sequence is matched against the text
    the caller reads (the cloud is sent none). ``hit`` once one matched; nothing passes after it."""

    def __init__(self, restorer: Restorer, stops: Sequence[str]) -> None:
        self.restorer, self.matcher, self.hit = restorer, StopMatcher(tuple(stops)), False

    def feed(self, piece: str) -> str:
        return self._match(self.restorer.feed(piece))

    def flush(self) -> str:
        text = self._match(self.restorer.flush())
        return text if self.hit else text + self.matcher.flush()

    def cut(self) -> str:
        """The stream broke: what may start a stop sequence is dropped with it (whoever continues
        the answer writes on from the text shown)."""
        text = self._match(self.restorer.cut())
        self.matcher.pending = ""
        return text

    def _match(self, text: str) -> str:
        if self.hit:
            return ""
        text, self.hit = self.matcher.feed(text)
        return text


class _Answer:
    """One answer being streamed: deltas in, chunks out, then the final chunk with the
    Completion. Shared by the async path and the sync client's inline edge path. A cloud answer's
    ``call`` records what streamed and the cloud's own count."""

    def __init__(
        self,
        backend: Backend,
        start: float,
        *,
        route: str,
        reason: str,
        score: float | None,
        call: _CloudCall | None = None,
        prefix: str = "",
        ttft_ms: float | None = None,
        restorer: Restorer | _RestoredStop | None = None,
        reader: ToolCallReader | None = None,
    ) -> None:
        self.backend, self.start, self.call = backend, start, call
        # a device model given tools: its text is read as calls as it comes (the cloud server
        # reads its own; a cloud's calls arrive as tool-call deltas)
        self.reader = reader
        self.route, self.reason, self.score, self.prefix = route, reason, score, prefix
        self.ttft = ttft_ms
        self.restorer = restorer  # the text is restored as it streams: parts hold what the user sees
        self.parts: list[str] = [prefix] if prefix else []
        self.logprobs: list[float] = []
        self.finish_reason, self.usage = "stop", Usage()
        self.stopped = False  # the restorer's stop matcher ended the answer (``_RestoredStop``)
        self.model: str | None = None  # the model its deltas name (a cloud's endpoints may differ)
        self.calls = CallsReader()  # the answer's tool calls (a request with tools; the cloud's)

    @property
    def model_name(self) -> str:
        """The model that wrote this answer: as its deltas say, else the backend's name."""
        return self.model or self.backend.model

    def feed(self, delta: Delta) -> Chunk | None:
        if delta.model is not None:
            self.model = delta.model
        if delta.logprob is not None:
            self.logprobs.append(delta.logprob)
        if delta.finish_reason is not None:
            self.finish_reason = "stop" if self.stopped else delta.finish_reason
            if delta.usage is not None:
                # a custom backend's NaN, infinite or negative figure is unknown, kept out of stats()
                self.usage = checked_usage(delta.usage, self.backend,
                                           "device" if self.call is None else "cloud")
                if self.call is not None:
                    self.call.usage = self.usage
        shown_calls = self._feed_calls(delta.tool_calls) if delta.tool_calls else []
        written = delta.text
        if self.reader is not None and written:  # text, or the calls it starts and goes on with
            written = self.reader.feed(written)
            shown_calls += self.calls.feed(self.reader.take_deltas())
        if not written and not shown_calls:
            return None
        text = ""
        if written:
            if self.call is not None:  # until the cloud's own count arrives: ~4 characters a token
                self.call.streamed += estimate_text_tokens(written)
            text = self.restorer.feed(written) if self.restorer is not None else written
            self._note_stop()
        if not text and not shown_calls:  # all of it held back: it may be the start of a placeholder
            return None
        if self.ttft is None:  # the first text the caller sees
            self.ttft = (time.perf_counter() - self.start) * 1000
        if text:
            self.parts.append(text)
        # read per chunk: a cloud learns its model's name from the endpoint
        return Chunk(text, self.route, self.model_name, tool_calls=shown_calls)

    def _feed_calls(self, pieces: list[ToolCallDelta]) -> list[ToolCallDelta]:
        """A delta's tool-call pieces: kept, and passed on as they are. With placeholders for
        personal data (privacy="redact") they are held and passed on whole, restored, with the
        last chunk: a value is never shown half way between its placeholder and itself."""
        self._checked(lambda: self.calls.feed([p.to_dict() for p in pieces]))
        if self.call is not None:
            self.call.streamed += sum(estimate_text_tokens(p.arguments) for p in pieces)
        return [] if self.restorer is not None else pieces

    def _checked(self, read: Callable[[], T]) -> T:
        """A custom backend's tool-call pieces read (ours are checked where they are made): one
        that is not OpenAI's shape is its side's error, saying what was wrong."""
        try:
            return read()
        except ValueError as exc:
            if self.call is not None:
                raise CloudUnavailableError(f"the cloud's answer holds a malformed tool call "
                                            f"({exc})") from exc
            raise EdgeError(f"the device's answer holds a malformed tool call ({exc})") from exc

    def _whole_calls(self) -> tuple[list[ToolCall], list[ToolCallDelta]]:
        """The answer's calls, and what of them the caller has not been shown yet (with
        placeholders: all of them, restored)."""
        if not self.calls:
            return [], []
        calls = self._checked(self.calls.calls)
        if self.restorer is None:
            return calls, []
        base = self.restorer.restorer if isinstance(self.restorer, _RestoredStop) else self.restorer
        calls = [ToolCall(c.id, Function(c.function.name, base.restore(c.function.arguments)))
                 for c in calls]
        return calls, [c.as_delta(i) for i, c in enumerate(calls)]

    def flush(self) -> Chunk | None:
        """The text the restorer still holds (the stream ended), as one last chunk."""
        chunk = self._shown(self.restorer.flush() if self.restorer is not None else "")
        self._note_stop()
        return chunk

    def _note_stop(self) -> None:
        """The restorer's stop matcher (``_RestoredStop``) ended the answer: it ends with "stop"."""
        if isinstance(self.restorer, _RestoredStop) and self.restorer.hit:
            self.stopped, self.finish_reason = True, "stop"

    def cut(self) -> Chunk | None:
        """The stream broke: what the restorer holds, if it is whole (``Restorer.cut``)."""
        return self._shown(self.restorer.cut() if self.restorer is not None else "")

    def _shown(self, text: str) -> Chunk | None:
        if not text:
            return None
        if self.ttft is None:
            self.ttft = (time.perf_counter() - self.start) * 1000
        self.parts.append(text)
        return Chunk(text, self.route, self.model_name)

    def finish(self) -> Chunk:
        # the sync client's inline path does not flush: what the restorer holds ends the answer
        held = self.flush()
        tail = held.text if held is not None else ""
        read: list[ToolCallDelta] = []
        if self.reader is not None:  # the rest: text held back, or the calls read from the whole answer
            rest, calls, self.finish_reason = self.reader.finish(self.finish_reason)
            if rest:
                self.parts.append(rest)
                tail += rest
            if self.ttft is None and (rest or calls):
                self.ttft = (time.perf_counter() - self.start) * 1000
            new = [{"index": i, **c} for i, c in enumerate(calls) if i >= self.reader.streamed]
            read = self.calls.feed(new)
        tool_calls, unshown = self._whole_calls()
        unshown = read + unshown
        usage = self.usage
        mean_lp = sum(self.logprobs) / len(self.logprobs) if self.logprobs and not self.prefix else None
        model = self.model_name
        completion = Completion(
            text="".join(self.parts),
            route=self.route,
            reason=self.reason,
            model=model,
            usage=usage,
            latency_ms=(time.perf_counter() - self.start) * 1000,
            ttft_ms=self.ttft,
            finish_reason=self.finish_reason,
            score=self.score,
            mean_logprob=mean_lp,
            energy_j=usage.energy_j,
            energy_source=usage.energy_source,
            region=usage.region,
            co2_g=usage.co2_g,
            co2_saved_g=usage.co2_saved_g,
            tool_calls=tool_calls,
        )
        return Chunk(tail, self.route, model, finish_reason=self.finish_reason, completion=completion,
                     tool_calls=unshown)
