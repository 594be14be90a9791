"""Streaming an answer as chunks: the device's, a backend's deltas, a finished answer replayed."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import aclosing
from typing import TYPE_CHECKING

from .._exceptions import CloudRateLimitError, CloudUnavailableError
from .._tool_answers import ToolCallReader
from .._tool_plan import plan_of
from .._types import MAX_MODEL_CHARS, Chunk, Completion, Usage
from ..backends.base import Backend, Delta, guarded
from ..backends.worker import InlineRun
from .answer import _Answer, _RestoredStop
from .failures import _cannot_continue, _NoOutput, _PartialOutput
from .ports import CacheHitLike, _CoreParts
from .request import Request, _CloudCall

if TYPE_CHECKING:
    from ..router.privacy import Restorer

Chunks = AsyncGenerator[Chunk, None]


class _Emitter(_CoreParts):
    def _emit_edge(
        self,
        req: Request,
        start: float,
        *,
        route: str,
        reason: str,
        score: float | None,
        prefix: str = "",
        ttft_ms: float | None = None,
        logprobs: bool = False,
        inline: bool = True,
        restorer: Restorer | _RestoredStop | None = None,
        max_tokens: int | None = None,
    ) -> Chunks:
        """The device answers; with ``prefix``, it continues that answer, writing at most
        ``max_tokens`` (what the prefix left of the request's own) new tokens."""
        # log-probabilities are cheap on the device: ask for them whenever the cache may keep
        # the answer, since an unsure answer is not stored
        want = logprobs or (self.cache is not None and self.cache_min_logprob is not None)
        params = dataclasses.replace(req.params, logprobs=True) if want else req.params
        if max_tokens is not None:
            params = dataclasses.replace(params, max_tokens=max_tokens)
        edge, msgs = self.edge, req.messages

        def run() -> Iterator[Delta]:
            if prefix:
                return edge.stream_continuation(msgs, prefix, params)
            return edge.stream(msgs, params)

        def make() -> Iterator[Delta]:  # a custom edge backend's own error is an EdgeError
            return guarded(run, edge, "edge", continuation=bool(prefix))

        plan = plan_of(params)  # a request with tools: the device's answer is read as calls
        if inline and req.inline_edge:
            answer = _Answer(
                edge, start, route=route, reason=reason, score=score, prefix=prefix, ttft_ms=ttft_ms,
                restorer=restorer, reader=plan.reader() if plan is not None else None,
            )
            return self._emit_inline(self.edge_worker.inline(make, answer.feed, answer.finish), prefix)
        return self._emit(
            self.edge_worker.stream(make),
            edge,
            start,
            route=route,
            reason=reason,
            score=score,
            prefix=prefix,
            ttft_ms=ttft_ms,
            req=req,
            restorer=restorer,
            reader=plan.reader() if plan is not None else None,
        )

    async def _emit(
        self,
        deltas: AsyncIterator[Delta],
        backend: Backend,
        start: float,
        *,
        route: str,
        reason: str,
        score: float | None,
        req: Request,
        call: _CloudCall | None = None,
        prefix: str = "",
        ttft_ms: float | None = None,
        restorer: Restorer | _RestoredStop | None = None,
        reader: ToolCallReader | None = None,
    ) -> Chunks:
        """Stream the deltas as chunks, then one final chunk with the completion. With
        ``call``, the deltas are a cloud call's, accounted in it; with ``prefix`` (already sent
        to the caller, first token at ``ttft_ms``), the backend continues that answer; with
        ``restorer``, the placeholders in the text are put back; with ``reader``, the text is read
        as tool calls (a device model given tools)."""
        answer = _Answer(
            backend, start, route=route, reason=reason, score=score, call=call, prefix=prefix,
            ttft_ms=ttft_ms, restorer=restorer, reader=reader,
        )
        try:
            async with aclosing(deltas) as stream:  # type: ignore[type-var]  # an async generator
                async for delta in stream:
                    chunk = answer.feed(delta)
                    if chunk is not None:
                        yield chunk
                    if answer.stopped:  # a stop sequence in the restored text: close the stream here
                        break
        except (CloudUnavailableError, CloudRateLimitError) as exc:
            if call is None:
                raise
            # a held-back piece that is a whole placeholder was streamed by the cloud: the caller
            # gets it; half of one ("[EMA") never reaches the caller, the device writes on instead
            held = answer.cut()
            if held is not None:
                yield held
            if answer.parts:
                raise _PartialOutput(exc, "".join(answer.parts), answer.ttft, answer.model) from exc
            raise _NoOutput(exc) from exc
        except NotImplementedError as exc:
            if not prefix:
                raise
            raise _cannot_continue(exc) from exc
        held = answer.flush()
        if held is not None:
            yield held
        yield answer.finish()

    async def _emit_inline(self, run: InlineRun, prefix: str) -> Chunks:
        """The sync client's edge path: ``run`` goes to the reading thread, which generates the
        chunks itself and hands back the final one (or the error) in ``run.outcome``."""
        try:
            yield run  # type: ignore[misc]  # not a Chunk: the sync client takes it
            try:
                final = await run.outcome
            except NotImplementedError as exc:
                if not prefix:
                    raise
                raise _cannot_continue(exc) from exc
            yield final
        finally:
            if not run.entered:  # the reader never took its turn: do not hold the device
                run.abandon()

    async def _replay(
        self,
        text: str,
        model: str,
        start: float,
        *,
        route: str,
        reason: str,
        score: float | None = None,
        similarity: float | None = None,
        usage: Usage | None = None,
        finish: str = "stop",
        ttft_ms: float | None = None,
        mean_logprob: float | None = None,
        prefix: str = "",
    ) -> Chunks:
        """Stream a finished answer (a cache hit, a held-back cascade draft) word by word; with
        ``prefix`` (already sent to the caller), ``text`` is the rest of it."""
        for piece in re.findall(r"\S*\s*", text) or [text]:
            if piece:
                if ttft_ms is None:
                    ttft_ms = (time.perf_counter() - start) * 1000
                yield Chunk(piece, route, model)
        completion = Completion(
            text=prefix + text,
            route=route,
            reason=reason,
            model=model,
            usage=usage or Usage(),
            latency_ms=(time.perf_counter() - start) * 1000,
            ttft_ms=ttft_ms,
            finish_reason=finish,
            score=score,
            cache_similarity=similarity,
            mean_logprob=mean_logprob,
        )
        yield Chunk("", route, model, finish_reason=finish, completion=completion)

    def _replay_hit(self, hit: CacheHitLike, start: float) -> Chunks:
        how = (
            "exact repeat"
            if hit.verifier_prob is None
            else f"similarity {hit.similarity:.3f}, verifier {hit.verifier_prob:.2f}"
        )
        return self._replay(
            hit.text,
            _writer_of(hit) or self.cache_model,
            start,
            route="cache",
            reason=f"cache hit ({how})",
            similarity=hit.similarity,
        )


def _writer_of(hit: CacheHitLike) -> str | None:
    """The model that wrote a cached answer, as stored with it: a hit's ``model`` names it, as the
    answer it replays did (it named the cache's key, "edge-model|cloud:cloud-model"). None for an
    entry stored without one (a custom cache, an older entry)."""
    metadata = getattr(hit, "metadata", None)
    model = metadata.get("model") if isinstance(metadata, dict) else None
    return model if isinstance(model, str) and 0 < len(model) <= MAX_MODEL_CHARS else None
