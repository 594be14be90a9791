"""The execute step (3): the cloud with the device as its fallback, the cascade, the edge."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING

from .._exceptions import CloudRateLimitError, CloudUnavailableError, ContextWindowExceededError
from .._types import Completion, Decision
from ..backends.base import Delta, aguarded
from .accounting import _Accounting
from .answer import _RestoredStop
from .emit import Chunks, _Emitter
from .failures import _REFUSED, _NoOutput, _PartialOutput, _too_long, _waits_for_cloud
from .plan import _ask_policy, _Planner, _redacted, _sent_nowhere
from .ports import rate_limited, wait_of
from .request import Request, _CloudCall

if TYPE_CHECKING:
    from ..router.privacy import Restorer

log = logging.getLogger("hybridllm")

EDGE_FALLBACK = "edge (cloud unavailable)"


class _Executor(_Planner, _Emitter, _Accounting):
    # 3. execute
    async def _execute(self, req: Request, d: Decision, start: float) -> Chunks:
        if d.route == "cloud":
            assert self.cloud is not None
            down = self._cloud_down()
            if down is not None:
                why, err = down
                if not req.edge_can_answer:  # the device cannot stand in
                    limited = rate_limited(self.cloud)  # waiting out its 429: a rate limit, not an outage
                    raise _waits_for_cloud(
                        req, f"the cloud is {'rate-limiting' if limited else 'unavailable'} ({why})",
                        "after its Retry-After" if limited else "once the cloud is back", limited=limited,
                        retry_after_s=wait_of(self.cloud)) from err
                req.stand_in = True
                self._release_unused(req)
                async with aclosing(
                    self._emit_edge(
                        req,
                        start,
                        route=EDGE_FALLBACK,
                        reason=f"{_sent_nowhere(d)}; cloud unavailable ({why})",
                        score=d.score,
                    )
                ) as source:
                    async for chunk in source:
                        yield chunk
                return
            try:
                async with aclosing(
                    self._emit_cloud(req, d, start, route="cloud", reason=d.reason)
                ) as source:
                    async for chunk in source:
                        yield chunk
                return
            except ContextWindowExceededError as exc:
                if req.fits_edge:
                    raise
                # the cloud's stream broke mid-answer and the device cannot hold the prompt to
                # finish it
                raise _waits_for_cloud(req, "the cloud's stream broke off mid-answer",
                                       "once the cloud is back") from exc
            except _NoOutput as exc:  # nothing was streamed yet: the device answers instead
                if req.params.tools is not None and getattr(exc.cause, "status_code", None) in _REFUSED:
                    raise exc.cause from None  # the cloud refused the request (its tools): its own words
                if not req.fits_edge and getattr(exc.cause, "status_code", None) in _REFUSED:
                    # the cloud's own window (or size limit) refuses it too: only a shorter prompt helps
                    raise _too_long(req, f"the cloud failed ({exc.cause}): it refuses it too",
                                    "or use a cloud model with a longer context") from exc.cause
                if not req.edge_can_answer:
                    limited = isinstance(exc.cause, CloudRateLimitError)  # up, but asks to wait (429)
                    raise _waits_for_cloud(req, f"the cloud {'is rate-limiting' if limited else 'failed'} "
                                           f"({exc.cause})", "once its Retry-After is over" if limited
                                           else "once the cloud is back", limited=limited,
                                           retry_after_s=getattr(exc.cause, "retry_after_s", None)
                                           or wait_of(self.cloud)) from exc.cause
                log.info("cloud failed before answering (%s); answering on the device", exc.cause)
                req.stand_in = True
                self._release_unused(req)
                async with aclosing(
                    self._emit_edge(
                        req,
                        start,
                        route=EDGE_FALLBACK,
                        score=d.score,
                        reason=f"{d.reason}; cloud failed: {exc.cause}",
                    )
                ) as source:
                    async for chunk in source:
                        yield chunk
                return
        if d.cascade and self.cloud is not None and self.policy is not None:
            async with aclosing(self._cascade(req, d, start)) as source:
                async for chunk in source:
                    yield chunk
            return
        async with aclosing(
            self._emit_edge(req, start, route="edge", reason=d.reason, score=d.score)
        ) as source:
            async for chunk in source:
                yield chunk

    async def _cascade(self, req: Request, d: Decision, start: float) -> Chunks:
        """Edge first, held back; if its confidence is low, the cloud answers instead."""
        assert self.cloud is not None and self.policy is not None
        draft: Completion | None = None
        async for chunk in self._emit_edge(
            req, start, route="edge", reason=d.reason, score=d.score, logprobs=True, inline=False
        ):
            draft = chunk.completion or draft
        assert draft is not None
        lp = draft.mean_logprob if draft.mean_logprob is not None else float("-inf")
        policy = self.policy
        escalate = bool(_ask_policy(policy, "should_escalate", lambda: policy.should_escalate(lp)))
        spent = None
        down = self._cloud_down() if escalate else None
        available = escalate and down is None
        # why the draft is kept after all: the reason says what the cloud did, as on the cloud route
        unavailable = f"the cloud is unavailable ({down[0]})" if down is not None else ""
        if available and self.ledger is not None:  # held only when the cloud is really asked
            req.reservation, spent = self.ledger.reserve(self._estimate(req))
        if available and not spent:
            try:
                async with aclosing(
                    self._emit_cloud(
                        req,
                        d,
                        start,
                        route="edge->cloud",
                        reason=f"{d.reason}; edge confidence {lp:.2f} too low{_redacted(d)}",
                    )
                ) as source:
                    async for chunk in source:
                        yield chunk
                return
            except _NoOutput as exc:
                log.info("cascade: cloud failed (%s); keeping the edge answer", exc.cause)
                unavailable = f"the cloud failed: {exc.cause}"
        req.stand_in = escalate  # the cloud should have answered: the unsure draft stands in
        why = (
            f"edge confident ({lp:.2f})"
            if not escalate
            else f"edge unsure ({lp:.2f}) but {spent or unavailable}"
        )
        async with aclosing(
            self._replay(
                draft.text,
                draft.model,
                start,
                route="edge",
                reason=f"{d.reason}; {why}",
                score=d.score,
                usage=draft.usage,
                finish=draft.finish_reason,
                ttft_ms=draft.ttft_ms,
                mean_logprob=draft.mean_logprob,
            )
        ) as source:
            async for chunk in source:
                yield chunk

    async def _emit_cloud(
        self, req: Request, d: Decision, start: float, *, route: str, reason: str
    ) -> Chunks:
        """The cloud answers; if its stream breaks mid-answer, the device finishes the answer
        from the text already streamed (route ``"<route>->edge"``), so the caller never sees the
        failure. Raises ``_NoOutput`` when the cloud failed before its first token. Every cloud
        call gets its record (``_CloudCall``) here, once, whichever caller made it; the record
        takes over the request's reservation."""
        assert self.cloud is not None
        cloud = self.cloud
        call = _CloudCall(self._prompt_tokens(req), reservation=req.reservation)
        req.reservation = None
        req.cloud_calls.append(call)
        restorer: Restorer | _RestoredStop | None = None
        params = req.params
        if d.placeholders:  # privacy="redact": the answer's placeholders are restored before anyone reads it
            from ..router.privacy import Restorer

            restorer = Restorer(d.placeholders)
            if params.stop:
                # the stop sequences are about the text the caller reads: matched after the values
                # are back (the cloud, native or the client's emulation, matched the placeholders:
                # stop "@" let "alice@example.com" through, stop "EMAIL" cut "[EMAIL_1]" to "[")
                restorer = _RestoredStop(restorer, params.stop)
                params = dataclasses.replace(params, stop=())
        opened: list[AsyncIterator[Delta]] = []  # the cloud's stream, once it is made

        def astream() -> AsyncIterator[Delta]:
            stream = cloud.astream(d.messages_for_cloud, params,  # type: ignore[call-arg]
                                   **({"priority": req.options.priority} if req.options.priority else {}))
            opened.append(stream)
            return stream

        try:
            async with aclosing(
                self._emit(
                    # a custom cloud backend's own error is a CloudUnavailableError: the device answers
                    aguarded(astream, cloud, "cloud"),
                    self.cloud,
                    start,
                    route=route,
                    reason=reason,
                    score=d.score,
                    call=call,
                    req=req,
                    restorer=restorer,
                )
            ) as source:
                async for chunk in source:
                    yield chunk
        except (GeneratorExit, asyncio.CancelledError):
            # the caller stopped the call: the cloud had the prompt by then, if a request of it
            # was out. The CloudBackend's stream says (``request_out``); a custom backend's
            # is taken to have sent it. Not while it waited out a Retry-After or a backoff, or
            # before it was made: such a call counted its prompt as a cloud call, so callers that
            # timed out against a cloud answering 429 spent the budget (3 calls an hour: the
            # device answered for an hour) with not one answer from the cloud
            call.hung_up = bool(opened) and getattr(opened[0], "request_out", True) is not False
            raise
        except _PartialOutput as exc:
            broke = f"cloud stream broke after {len(exc.text)} characters ({exc.cause})"
            if req.params.tools is not None:  # a call half written by one model: no other finishes it
                raise CloudUnavailableError(f"The {broke}; an answer to a request with tools is not "
                                            "finished by the device: retry the request.") from exc
            # the cloud's answer is not whole: not stored, so the cloud's whole answer is, once it
            # answers (before, the stitched answer was served from the cache)
            req.stand_in = True
            # max_tokens bounds the whole answer the caller reads: the device writes what the
            # cloud's part left of it, counted as the answer's usage counts that part
            left = req.params.max_tokens - call.cost().completion_tokens
            if left < 1:  # the cloud's part used it all: the answer ends here, cut at max_tokens
                log.warning("%s, with max_tokens used: the answer ends there", broke)
                async with aclosing(self._replay(
                        "", exc.model or cloud.model, start, route=route, finish="length",
                        score=d.score, ttft_ms=exc.ttft_ms, prefix=exc.text,
                        reason=f"{reason}; {broke}, with max_tokens ({req.params.max_tokens}) used",
                )) as source:
                    async for chunk in source:
                        yield chunk
                return
            log.warning("%s; the device finishes it", broke)
            async with aclosing(
                self._emit_edge(
                    req,
                    start,
                    route=f"{route}->edge",
                    score=d.score,
                    prefix=exc.text,
                    max_tokens=left,
                    ttft_ms=exc.ttft_ms,
                    reason=f"{reason}; {broke}; the device finished the answer",
                    # the device writes on through the same restorer: a placeholder it repeats
                    # from the answer so far is restored too
                    restorer=restorer,
                )
            ) as source:
                try:
                    async for chunk in source:
                        yield chunk
                except ContextWindowExceededError as full:
                    if not req.fits_edge:
                        raise  # the prompt alone is too long: _execute says so
                    # the prompt fits; the answer the cloud streamed does not fit beside it: a
                    # failure of the cloud, not of the request (not context_length_exceeded, which
                    # tells a client to shorten a conversation that was fine)
                    raise CloudUnavailableError(
                        f"the cloud stream broke after {len(exc.text)} characters ({exc.cause}) "
                        f"and the device cannot finish the answer: the prompt ({req.prompt_tokens} "
                        f"tokens) and the answer so far ({full.prompt_tokens} tokens together) "
                        f"leave no room in its context (n_ctx {full.context_length}); retry the "
                        "request"
                    ) from full
