"""The request pipeline shared by HybridLLM and AsyncHybridLLM: one async core, four steps.

    lookup   the semantic cache (the question embedded once, reused by the router and the store)
    plan     the prompt counted once with the device's tokenizer; policy + router -> one Decision
             with its reason; a prompt the device cannot hold goes to the cloud (or fails: with
             ContextWindowExceededError where no cloud may take it, with CloudBudgetSpentError or
             CloudUnavailableError where it cannot now); a cloud call reserves its room in the
             budget ledger, and a spent budget or an open circuit turns a cloud decision into an
             edge one
    execute  edge (on its own thread), cloud (httpx AsyncClient), cascade, or cloud->edge
             continuation when a cloud stream breaks mid-answer
    record   the cache store (confident answers only), the stats; the ledger's reservation is
             settled with the call's real tokens, or released when no call answered

Every optional part (cache, cloud, policy, budget) may be None; the edge is always there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._exceptions import (
    CloudBudgetSpentError,
    CloudError,
    CloudRateLimitError,
    CloudUnavailableError,
    ConfigError,
    ContextWindowExceededError,
    HybridLLMError,
    InvalidRequestError,
    RouterError,
)
from ._stats import Stats
from ._types import (
    Chunk,
    Completion,
    Decision,
    GenerationParams,
    Message,
    Messages,
    Usage,
    check_option_names,
    estimate_text_tokens,
    estimate_tokens,
    normalize_messages,
)
from .backends.base import Backend, Delta, StopMatcher, aguarded, call_guarded, guarded
from .backends.worker import EdgeWorker, InlineRun

if TYPE_CHECKING:
    from .router.privacy import Restorer

log = logging.getLogger("hybridllm")

EDGE_FALLBACK = "edge (cloud unavailable)"
Chunks = AsyncGenerator[Chunk, None]


class CacheHitLike(Protocol):
    @property
    def text(self) -> str: ...

    @property
    def similarity(self) -> float: ...

    @property
    def verifier_prob(self) -> float | None: ...


class CachePort(Protocol):
    """What the pipeline needs of a cache (:class:`hybridllm.cache.SemanticCache` is one)."""

    def embed_query(self, messages: Messages) -> Any:
        """The question's embedding, reused by the router and the store. Optional, as
        ``get_exact`` is: a cache without it is looked up with ``embedding=None``."""
        ...

    def get_exact(
        self, messages: Messages, *, model: str, params_key: dict, namespace: str | None = None
    ) -> CacheHitLike | None:
        """An exact repeat only, without the embedder; a miss is not counted. Optional: the
        lookup asks for it with ``getattr`` and goes straight to ``get`` for a cache without it."""
        ...

    def get(
        self,
        messages: Messages,
        *,
        model: str,
        params_key: dict,
        namespace: str | None = None,
        embedding: Any = None,
        exact_checked: bool = False,
    ) -> CacheHitLike | None:
        """``exact_checked=True`` (passed only to a cache that has ``get_exact``): ``get_exact``
        just missed for these messages, so ``get`` need not look for the exact repeat again."""
        ...

    def put(
        self,
        messages: Messages,
        text: str,
        *,
        model: str,
        params_key: dict,
        namespace: str | None = None,
        pii: bool = False,
        metadata: dict | None = None,
        embedding: Any = None,
    ) -> str | None: ...

    def close(self) -> None: ...


class PolicyPort(Protocol):
    """What the pipeline needs of a routing policy (:class:`hybridllm.router.RoutingPolicy`)."""

    def decide(
        self,
        messages: Sequence[Message],
        *,
        force: str | None = None,
        prompt_tokens: int | None = None,
        embedding: Any = None,
    ) -> Decision: ...

    def should_escalate(self, mean_logprob: float) -> bool: ...


class LedgerPort(Protocol):
    """The cloud budget (:class:`hybridllm.router.Budget`): reserve-then-settle, so that it holds
    under concurrency."""

    def exhausted(self) -> str | None: ...

    def reserve(self, tokens: int = 0) -> tuple[Any, str | None]: ...

    def settle(self, reservation: Any, tokens: int) -> None: ...

    def release(self, reservation: Any) -> None: ...

    def record(self, tokens: int = 0) -> None: ...

    def usage(self) -> dict[str, int]: ...


@dataclasses.dataclass
class Options:
    """Per-call options that are not sampling parameters."""

    route: str | None = None  # force "edge" or "cloud"
    cache: bool = True  # look up and store in the semantic cache (None passed: this default)
    cascade: bool | None = None  # None: as the policy says
    namespace: str | None = None  # cache namespace (tenant or user)
    priority: str | None = None  # "interactive" (the fastest cloud) or "batch" (the cleanest grid)

    @classmethod
    def pop_from(cls, kwargs: dict[str, Any]) -> Options:
        opts = cls(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(cls) if f.name in kwargs})
        if opts.route not in (None, "edge", "cloud"):
            raise InvalidRequestError(f"route must be 'edge', 'cloud' or None, got {opts.route!r}.")
        # None is the default for both (the cache used, the policy's cascade), as for every option;
        # anything else but a bool is refused (1 or "no" passed "cascade in (None, True, False)")
        for name in ("cache", "cascade"):
            value = getattr(opts, name)
            if value is not None and not isinstance(value, bool):
                raise InvalidRequestError(f"cache and cascade must be True or False, or None for the "
                                          f"default; got {name}={value!r}.")
        if opts.cache is None:
            opts.cache = True
        if opts.namespace is not None and not (isinstance(opts.namespace, str) and opts.namespace):
            # "" is not the default namespace: a tenant named "" would read the default's answers
            raise InvalidRequestError(f"namespace must be a non-empty string, got {opts.namespace!r}.")
        from .carbon import check_priority

        check_priority(opts.priority)
        return opts


@dataclasses.dataclass
class Request:
    """A validated request: built at the call, so bad input raises there."""

    messages: Messages
    params: GenerationParams
    options: Options
    # each cloud call this request made: the ledger, the cost and the stats read them when the
    # request ends, also when the caller stops reading early
    cloud_calls: list[_CloudCall] = dataclasses.field(default_factory=list)
    # the sync client reads on its own thread: an edge answer is generated there (InlineRun)
    inline_edge: bool = False
    # the prompt in the device's tokens, counted once in the plan step (None: the edge cannot
    # tell), and the device's context (n_ctx): the context check, the router and the budget's
    # estimate all read them
    prompt_tokens: int | None = None
    context_length: int | None = None
    # the budget's room held for this request's cloud call until the call starts (then the
    # call's own record holds it); released when the request ends without one
    reservation: Any = None
    # the device answered in the cloud's place (the cloud down or failing, the budget spent, a
    # cascade's escalation that could not happen): its answer is not stored, or a hit would serve
    # it to the same question once the cloud can answer it again
    stand_in: bool = False

    @property
    def fits_edge(self) -> bool:
        """The prompt and at least one answer token fit the device's context. ``max_tokens`` does
        not count: a device answer stops with finish_reason "length" where the context ends."""
        n, limit = self.prompt_tokens, self.context_length
        return n is None or limit is None or n + 1 <= limit


@dataclasses.dataclass
class _CloudCall:
    """One cloud call's accounting, filled in as the call runs and read once the request ends: by
    the ledger (``Core._settle``), the answer's ``cost_usd`` and ``usage`` and the stats
    (``_account``)."""

    prompt: int  # the prompt in the device's tokens (~4 characters a token without a tokenizer)
    reservation: Any = None  # the budget's room held for this call (None: none, a forced route)
    streamed: int = 0  # what streamed, ~4 characters a token, as the cloud sent it (placeholders)
    usage: Usage | None = None  # the cloud's own count, when it arrived
    hung_up: bool = False  # the caller closed the stream or cancelled while the call ran

    def cost(self) -> Usage:
        """What the call cost: the cloud's own count; without one (the stream broke, the caller
        hung up, a server that reports no usage) the prompt plus what streamed, since the cloud
        read the whole prompt before its first token; nothing for a call that failed before
        streaming anything. A call the caller hung up on before its first token costs its
        prompt: the request was sent, and the cloud did the prefill."""
        if self.usage is not None and self.usage.total_tokens:
            return Usage(self.usage.prompt_tokens, self.usage.completion_tokens)
        if self.streamed or self.hung_up:
            return Usage(self.prompt, self.streamed)
        return Usage()


class ForcedCloudOverBudgetError(CloudBudgetSpentError):
    """A forced cloud route met a spent budget where forced routes are held to it
    (``Core.budget_binds_forced_cloud``): refused, sent nowhere."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, reason=reason)


class _NoOutput(Exception):
    """The cloud failed before streaming anything: safe to answer on the device instead."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _PartialOutput(Exception):
    """The cloud failed after streaming ``text``: the device continues from there."""

    def __init__(self, cause: Exception, text: str, ttft_ms: float | None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.text = text
        self.ttft_ms = ttft_ms


class Core:
    def __init__(
        self,
        *,
        edge: Backend,
        cloud: Backend | None = None,
        cache: CachePort | None = None,
        policy: PolicyPort | None = None,
        ledger: LedgerPort | None = None,
        defaults: dict[str, Any] | None = None,
        namespace: str = "default",
        price_per_1k_tokens: float = 0.0,
        cache_min_logprob: float | None = None,
        edge_max_waiting: int = 64,
        edge_wait_timeout_s: float | None = 300.0,
    ) -> None:
        self.edge = edge
        self.cloud = cloud
        self.cache = cache
        self.policy = policy
        self.ledger = ledger
        self.defaults = {k: v for k, v in (defaults or {}).items() if v is not None}
        self.namespace = namespace
        self.cache_min_logprob = cache_min_logprob
        self.stats = Stats(price_per_1k_tokens=price_per_1k_tokens)
        # an answer is keyed by the models that can make it: the configured cloud model too, so
        # answers of another cloud model are not served after cloud_model changes
        cloud_name = "" if cloud is None or cloud.model == "cloud" else f":{cloud.model}"
        self.cache_model = edge.model + ("|cloud" + cloud_name if cloud is not None else "")
        self.edge_worker = EdgeWorker(edge, max_waiting=edge_max_waiting, wait_timeout_s=edge_wait_timeout_s)
        # a forced cloud route skips the budget for a library caller (its own money) and is held
        # to it where callers are not the budget's owner (hybridllm serve's HTTP clients)
        self.budget_binds_forced_cloud = False
        self.close_timeout_s = 30.0  # how long close() waits for the device's current step
        self._closed = False
        self._cache_write_failed = False
        self._cache_embed_failed = False  # an embedder that cannot load says so once, not per request
        GenerationParams.from_kwargs(**self.defaults)  # bad defaults fail at construction

    # -- validation, at the call --------------------------------------------------------------
    def prepare(self, messages: str | Sequence[Message], params: dict[str, Any]) -> Request:
        if self._closed:
            raise HybridLLMError("This client is closed; create a new HybridLLM.")
        overrides = dict(params)
        opts = Options.pop_from(overrides)
        check_option_names(overrides, routing=[f.name for f in dataclasses.fields(Options)])
        if opts.route == "cloud" and self.cloud is None:
            raise ConfigError("route='cloud' needs a cloud endpoint: pass cloud_url=...")
        merged = {**self.defaults, **{k: v for k, v in overrides.items() if v is not None}}
        return Request(normalize_messages(messages), GenerationParams.from_kwargs(**merged), opts)

    # -- the pipeline -------------------------------------------------------------------------
    async def run(self, req: Request) -> Chunks:
        """Yield the answer's chunks; the last one carries the Completion."""
        start = time.perf_counter()
        use_cache = self.cache is not None and req.options.cache and req.options.route is None
        answered = False  # the stats have the answer, with its cloud calls' cost
        try:
            vec, hit = await self._lookup(req) if use_cache else (None, None)
            decision = None if hit is not None else await self._plan(req, vec)
            source = self._replay_hit(hit, start) if hit is not None else self._execute(req, decision, start)  # type: ignore[arg-type]
            final: Chunk | None = None
            async with aclosing(source) as chunks:
                async for chunk in chunks:
                    if chunk.completion is not None:  # (an InlineRun has none: passed on)
                        final = chunk  # held back until recorded, so a caller that stops at the
                        continue  # finish chunk still leaves stats and cache complete
                    yield chunk
            if final is not None and final.completion is not None:
                if decision is None:  # a cache hit: it saved the call that made the answer it replays
                    self.stats.record(final.completion, avoided_tokens=_tokens_of(hit))
                else:
                    cloud_tokens = _account(self.stats, req, final.completion)
                    answered = True  # _record's first step: the stats take the answer
                    await self._record(req, decision, final.completion, vec, use_cache, cloud_tokens)
                yield final
        finally:
            self._settle(req, answered=answered)

    def _settle(self, req: Request, *, answered: bool = False) -> None:
        """The ledger learns what this request's cloud calls cost, whichever way it ended (an
        answer, an error, a caller that stopped reading, a cancelled task): a call's reservation
        is settled with its cost (``_CloudCall.cost``), or released when it cost nothing; room
        held for a call that never started is released. A request that ended without an answer
        the stats took (``answered``) gives them its calls' cost here, so that ``cloud_tokens``
        and ``cloud_cost_usd`` stay what the ledger counts."""
        held, req.reservation = req.reservation, None
        calls = list(req.cloud_calls)
        req.cloud_calls.clear()
        if not answered:
            self.stats.record_cloud_cost(sum(call.cost().total_tokens for call in calls))
        if self.ledger is None:
            return
        if held is not None:
            self.ledger.release(held)
        for call in calls:
            tokens = call.cost().total_tokens
            if call.reservation is None:
                if tokens:  # a call made without a reservation (a forced cloud route)
                    self.ledger.record(tokens)
            elif tokens:
                self.ledger.settle(call.reservation, tokens)
            else:  # it failed before answering: it cost nothing
                self.ledger.release(call.reservation)

    def _release_unused(self, req: Request) -> None:
        """The device answers in the cloud's place: the room held for a cloud call that will not
        be made (or that failed before costing anything) is freed now, not once the device's
        answer ends; meanwhile it read as a call in flight, so that a request planned then was
        told "budget spent (1 in flight)" (a long prompt: CloudBudgetSpentError, not that the
        cloud is down)."""
        if self.ledger is None:
            return
        held, req.reservation = req.reservation, None
        if held is not None:
            self.ledger.release(held)
        for call in req.cloud_calls:
            if call.reservation is not None and not call.cost().total_tokens:
                self.ledger.release(call.reservation)
                call.reservation = None

    # 1. lookup
    async def _lookup(self, req: Request) -> tuple[Any, CacheHitLike | None]:
        assert self.cache is not None
        cache = self.cache
        ns = req.options.namespace or self.namespace

        def lookup() -> tuple[Any, CacheHitLike | None]:
            # an exact repeat first, without the embedder (a cache may not offer it: optional)
            exact = getattr(cache, "get_exact", None)
            if exact is not None:
                try:
                    hit = exact(req.messages, model=self.cache_model, params_key=req.params.cache_key(),
                                namespace=ns)
                except Exception as exc:  # noqa: BLE001 - answer without the cache
                    log.warning("semantic cache lookup failed: %s", exc)
                    return None, None
                if hit is not None:
                    return None, hit
            # optional too: a cache= needs only get() and put() (the client checks no more), and
            # a custom cache's own error (not a HybridLLMError) failed every request with it
            embed = getattr(cache, "embed_query", None)
            try:
                vec = embed(req.messages) if embed is not None else None
            except Exception as exc:  # noqa: BLE001 - a broken cache must not break answering
                if not self._cache_embed_failed:
                    self._cache_embed_failed = True
                    log.warning("semantic cache embedding failed (%s); answering without the cache "
                                "(logged once)", exc)
                return None, None
            # a cache that offers get_exact takes exact_checked= in get (SemanticCache): the exact
            # repeat was just looked up above, so get does not read it again
            skip: dict[str, Any] = {"exact_checked": True} if exact is not None else {}
            try:
                return vec, cache.get(
                    req.messages,
                    model=self.cache_model,
                    params_key=req.params.cache_key(),
                    namespace=ns,
                    embedding=vec,
                    **skip,
                )
            except Exception as exc:  # noqa: BLE001 - same: answer without the cache
                log.warning("semantic cache lookup failed: %s", exc)
                return vec, None

        return await asyncio.get_running_loop().run_in_executor(None, lookup)

    # 2. plan
    async def _plan(self, req: Request, vec: Any) -> Decision:
        msgs, opts = req.messages, req.options
        if self.cloud is None:  # the device's own check refuses a prompt past its context
            return Decision("edge", "edge: no cloud configured", messages_for_cloud=msgs)
        loop = asyncio.get_running_loop()
        # counted once, with the device's tokenizer: the context check, the router and the
        # budget's estimate read this one count
        req.prompt_tokens = await loop.run_in_executor(None, call_guarded, self.edge.count_tokens,
                                                        self.edge, "edge", msgs)
        req.context_length = call_guarded(lambda: self.edge.context_length, self.edge, "edge")
        if self.policy is None:
            route = opts.route or "cloud"
            d = Decision(
                route,
                f"{route}: no router configured",
                messages_for_cloud=msgs,
                forced=opts.route is not None,
            )
        else:
            policy, tokens = self.policy, req.prompt_tokens
            d = await loop.run_in_executor(
                None, _ask_policy, policy, "decide",
                lambda: policy.decide(msgs, force=opts.route, prompt_tokens=tokens, embedding=vec),
            )
            if not isinstance(d, Decision):  # else an AttributeError on .route, far from its cause
                raise RouterError(f"The routing policy {type(policy).__name__}.decide() returned "
                                  f"{type(d).__name__}, not a hybridllm.Decision; nothing was sent.")
        if not req.fits_edge:
            d = self._beyond_the_edge(req, d)
        elif opts.cascade is not None:
            d = dataclasses.replace(
                d, cascade=bool(opts.cascade and d.route == "edge" and d.score is not None and not d.forced)
            )
        binds = not d.forced or self.budget_binds_forced_cloud
        if d.route == "cloud" and binds and self.ledger is not None:
            # one step under the ledger's lock: of concurrent requests, only as many as fit pass
            req.reservation, spent = self.ledger.reserve(self._estimate(req))
            if spent and d.forced:  # the caller chose the cloud: refused, not moved to the device
                raise ForcedCloudOverBudgetError(spent)
            if spent:
                if not req.fits_edge:  # the device cannot stand in: wait for the budget
                    raise _waits_for_cloud(req, f"the cloud {spent}", "once the budget has room",
                                           spent=spent, retry_after_s=wait_of(self.ledger))
                reason = f"{_sent_nowhere(d)}; {spent}"
                req.stand_in = True
                return dataclasses.replace(d, route="edge", reason=reason, cascade=False)
        return d

    def _beyond_the_edge(self, req: Request, d: Decision) -> Decision:
        """A prompt the device cannot hold goes to the cloud, whatever the router thought, unless
        the caller forced the device or privacy keeps it there: then a clear error."""
        if d.route == "cloud" and d.forced:
            return d
        if d.route == "edge" and d.forced:
            raise _too_long(req, "route='edge' keeps it on the device",
                            "or leave out route='edge' so that the cloud answers it")
        if d.private:  # the kinds, not the reason: that names privacy='redact' too, as the error does
            found = f"it contains {', '.join(d.pii_kinds)}" if d.pii_kinds else d.reason
            raise _too_long(req, f"privacy keeps it on the device ({found})",
                            "or set privacy='redact' to send it to the cloud with the personal data "
                            "replaced")
        n, limit = req.prompt_tokens, req.context_length
        reason = f"too long for the device: {n} prompt tokens, n_ctx {limit}"
        if d.pii_kinds and d.messages_for_cloud != req.messages:
            reason += f"; {', '.join(d.pii_kinds)} redacted for the cloud"
        return dataclasses.replace(d, route="cloud", reason=reason, cascade=False)

    def _estimate(self, req: Request) -> int:
        """What a reservation holds: the prompt plus a whole answer of max_tokens, the most the
        call can cost; the cloud's own count replaces it when the call ends."""
        return self._prompt_tokens(req) + req.params.max_tokens

    def _prompt_tokens(self, req: Request) -> int:
        if req.prompt_tokens is not None:
            return req.prompt_tokens
        return estimate_tokens(req.messages)  # an edge without a tokenizer: ~4 characters a token

    def _cloud_down(self) -> tuple[str, HybridLLMError | None] | None:
        """Why the cloud cannot take a request now (and the error behind it, if one), or None when it
        can. A custom cloud backend whose is_available() or unavailable_reason() raises counts as
        unavailable, its error named in the reason: the device answers in its place, as for an open
        circuit, and the request fails only where the device cannot hold the prompt."""
        cloud = self.cloud
        assert cloud is not None
        try:
            if call_guarded(cloud.is_available, cloud, "cloud"):
                return None
        except HybridLLMError as exc:  # a foreign error comes wrapped, the original as its __cause__
            return f"its is_available() raised {_named(exc)}", exc
        # what the cloud last did ("circuit open after: HTTP 404 from http://h/v1/..."), if it says
        said = getattr(cloud, "unavailable_reason", None)
        if said is None:
            return "circuit open, or its Retry-After not over", None
        try:
            return call_guarded(said, cloud, "cloud"), None
        except HybridLLMError as exc:
            return f"its unavailable_reason() raised {_named(exc)}", exc

    # 3. execute
    async def _execute(self, req: Request, d: Decision, start: float) -> Chunks:
        if d.route == "cloud":
            assert self.cloud is not None
            down = self._cloud_down()
            if down is not None:
                why, err = down
                if not req.fits_edge:  # the device cannot stand in
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
                if not req.fits_edge and getattr(exc.cause, "status_code", None) in _REFUSED:
                    # the cloud's own window (or size limit) refuses it too: only a shorter prompt helps
                    raise _too_long(req, f"the cloud failed ({exc.cause}): it refuses it too",
                                    "or use a cloud model with a longer context") from exc.cause
                if not req.fits_edge:
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
            from .router.privacy import Restorer

            restorer = Restorer(d.placeholders)
            if params.stop:
                # the stop sequences are about the text the caller reads: matched after the values
                # are back (the cloud, native or the client's emulation, matched the placeholders:
                # stop "@" let "alice@example.com" through, stop "EMAIL" cut "[EMAIL_1]" to "[")
                restorer = _RestoredStop(restorer, params.stop)
                params = dataclasses.replace(params, stop=())
        try:
            async with aclosing(
                self._emit(
                    # a custom cloud backend's own error is a CloudUnavailableError: the device answers
                    aguarded(lambda: cloud.astream(d.messages_for_cloud, params,  # type: ignore[call-arg]
                                                   **({"priority": req.options.priority}
                                                      if req.options.priority else {})), cloud, "cloud"),
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
            call.hung_up = True  # the caller stopped the call: the cloud had the prompt by then
            raise
        except _PartialOutput as exc:
            log.warning(
                "cloud stream broke after %d characters (%s); the device finishes it",
                len(exc.text),
                exc.cause,
            )
            async with aclosing(
                self._emit_edge(
                    req,
                    start,
                    route=f"{route}->edge",
                    score=d.score,
                    prefix=exc.text,
                    ttft_ms=exc.ttft_ms,
                    reason=f"{reason}; cloud stream broke after {len(exc.text)} characters "
                    f"({exc.cause}); the device finished the answer",
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
    ) -> Chunks:
        # log-probabilities are cheap on the device: ask for them whenever the cache may keep
        # the answer, since an unsure answer is not stored
        want = logprobs or (self.cache is not None and self.cache_min_logprob is not None)
        params = dataclasses.replace(req.params, logprobs=True) if want else req.params
        edge, msgs = self.edge, req.messages

        def run() -> Iterator[Delta]:
            if prefix:
                return edge.stream_continuation(msgs, prefix, params)
            return edge.stream(msgs, params)

        def make() -> Iterator[Delta]:  # a custom edge backend's own error is an EdgeError
            return guarded(run, edge, "edge", continuation=bool(prefix))

        if inline and req.inline_edge:
            answer = _Answer(
                edge, start, route=route, reason=reason, score=score, prefix=prefix, ttft_ms=ttft_ms,
                restorer=restorer,
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
    ) -> Chunks:
        """Stream the deltas as chunks, then one final chunk with the completion. With
        ``call``, the deltas are a cloud call's, accounted in it; with ``prefix`` (already sent
        to the caller, first token at ``ttft_ms``), the backend continues that answer; with
        ``restorer``, the placeholders in the text are put back."""
        answer = _Answer(
            backend, start, route=route, reason=reason, score=score, call=call, prefix=prefix,
            ttft_ms=ttft_ms, restorer=restorer,
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
                raise _PartialOutput(exc, "".join(answer.parts), answer.ttft) from exc
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
    ) -> Chunks:
        """Stream a finished answer (a cache hit, a held-back cascade draft) word by word."""
        for piece in re.findall(r"\S*\s*", text) or [text]:
            if piece:
                if ttft_ms is None:
                    ttft_ms = (time.perf_counter() - start) * 1000
                yield Chunk(piece, route, model)
        completion = Completion(
            text=text,
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
            self.cache_model,
            start,
            route="cache",
            reason=f"cache hit ({how})",
            similarity=hit.similarity,
        )

    # 4. record
    async def _record(self, req: Request, d: Decision, c: Completion, vec: Any, use_cache: bool,
                      cloud_tokens: int = 0) -> None:
        self.stats.record(c, cloud_tokens=cloud_tokens)
        if not use_cache or not c.text.strip() or self.cache is None:
            return
        if c.finish_reason != "stop":  # cut by max_tokens or the context: a hit would replay it as whole
            return
        if req.stand_in:  # the device's answer in the cloud's place: the cloud's is stored once it answers
            return
        floor = self.cache_min_logprob
        if floor is not None and c.mean_logprob is not None and c.mean_logprob < floor:
            log.info(
                "not caching an unsure answer (mean token log-probability %.2f < %.2f)", c.mean_logprob, floor
            )
            return
        cache, ns = self.cache, req.options.namespace or self.namespace
        # with no cloud (or no policy) no privacy scan ran in the plan step: the cache's store_pii
        # still keeps personal data out of the file, so the prompt is scanned here
        unscanned = self.cloud is None or self.policy is None

        def put() -> None:
            try:
                pii = bool(d.pii_kinds) or (unscanned and _holds_pii(req.messages))
                cache.put(
                    req.messages,
                    c.text,
                    model=self.cache_model,
                    params_key=req.params.cache_key(),
                    namespace=ns,
                    pii=pii,
                    metadata={"route": c.route, "model": c.model, "tokens": c.usage.total_tokens},
                    embedding=vec,
                )
            except Exception as exc:  # noqa: BLE001 - a cache that cannot write never costs the answer
                if not self._cache_write_failed:
                    self._cache_write_failed = True
                    log.warning(
                        "the semantic cache cannot store answers (%s: %s); answering "
                        "without storing (logged once)",
                        type(exc).__name__,
                        exc,
                    )

        await asyncio.get_running_loop().run_in_executor(None, put)

    async def aclose(self) -> None:
        if not self._closed and self.cloud is not None:
            try:
                await self.cloud.aclose()  # its connections on this loop
            except Exception as exc:  # noqa: BLE001 - the device model is freed all the same
                _close_failed(self.cloud, "cloud", exc)
        # off the loop: close() waits for the device's current step (a long prompt's prefill took
        # 1.3 s on SmolLM2, up to close_timeout_s), and the app's loop must keep running meanwhile
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            edge: Backend | None = self.edge
            if not self.edge_worker.close(timeout_s=self.close_timeout_s):
                # freeing a llama.cpp / ONNX Runtime model under the thread still running it
                # would crash the process: it stays loaded until that step ends and the process exits
                log.warning("the device model was still generating %.0f s after close(); it is left "
                            "loaded instead of being freed under the running step", self.close_timeout_s)
                edge = None
            for side, part in (("edge", edge), ("cloud", self.cloud), ("cache", self.cache)):
                # (a cache= with get() and put() alone has nothing to close: not a failure to log)
                if part is not None and (side != "cache" or callable(getattr(part, "close", None))):
                    try:
                        part.close()
                    except Exception as exc:  # noqa: BLE001 - one part's failure must not keep the others open
                        _close_failed(part, side, exc)


def _ask_policy(policy: object, method: str, call: Any) -> Any:
    """A routing policy's answer. A custom policy's own error (not a HybridLLMError) is raised as
    it is, so that an app catches its own type, with a note naming the policy and the method: the
    bare error from deep in an app's policy said nothing of routing."""
    try:
        return call()
    except HybridLLMError:
        raise
    except Exception as exc:
        exc.add_note(f"hybridllm: raised by the routing policy {type(policy).__name__}.{method}(); "
                     "the request was not answered")
        raise


def _named(exc: HybridLLMError) -> str:
    """A guarded call's error as "Type: message": the backend's own (the wrapped error's cause), or ours."""
    own = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
    return f"{type(own).__name__}: {own}" if str(own) else type(own).__name__


def _close_failed(part: object, side: str, exc: Exception) -> None:
    """A part whose close() raised: said as a warning (the original in the debug log), not raised, so
    that the client's other parts and its threads are closed too and a ``with`` block's own result
    (or error) stands."""
    name = getattr(part, "name", None) or side
    log.warning("closing the %s part %r (%s) failed: %s: %s; the client's other parts were closed",
                side, name, type(part).__name__, type(exc).__name__, exc)
    log.debug("the %s part's close() error", side, exc_info=exc)


def _redacted(d: Decision) -> str:
    """The reason's note for a request the cloud is sent with placeholders for its values."""
    from .router.privacy import redaction_note

    return redaction_note(d.pii_kinds) if d.placeholders else ""


def _sent_nowhere(d: Decision) -> str:
    """A cloud decision's reason for the device's answer after all (budget spent, cloud down):
    nothing was sent, so no note that values were redacted for the cloud."""
    note = _redacted(d)
    return d.reason.replace(note, "") if note else d.reason


def _holds_pii(messages: Messages) -> bool:
    from .router.privacy import pii_kinds_in_messages

    return bool(pii_kinds_in_messages(messages))


def _too_long(req: Request, why: str, what: str) -> ContextWindowExceededError:
    n, limit = req.prompt_tokens, req.context_length
    return ContextWindowExceededError(
        f"The prompt is {n} tokens; the device model's context holds {limit} (n_ctx), at least one "
        f"of them for the answer; and {why}. Shorten the conversation (drop its oldest turns), "
        f"raise n_ctx if the model allows it, {what}.",
        prompt_tokens=n,
        context_length=limit,
    )


@runtime_checkable
class WaitPort(Protocol):
    """A part that says when it takes a request again: the cloud (CloudBackend) and the budget
    (Budget); a custom cloud backend may lack it."""

    def retry_after_s(self) -> float | None: ...


def wait_of(part: object) -> float | None:
    """Seconds until the part takes a request again, where it can say; None otherwise (a budget
    limit of 0 never has room). A custom cloud backend's retry_after_s() that raises gives no hint
    (logged), rather than failing the request that asked for it."""
    if not isinstance(part, WaitPort):
        return None
    try:
        return part.retry_after_s()
    except Exception as exc:  # noqa: BLE001 - only a hint for the caller's retry
        log.warning("%s.retry_after_s() raised %s: %s; no Retry-After given", type(part).__name__,
                    type(exc).__name__, exc)
        return None


def rate_limited(part: object) -> bool:
    """Whether the cloud is unavailable because it rate-limits (waiting out a 429's Retry-After),
    where it can say (CloudBackend.rate_limited); a custom cloud without it, or whose rate_limited()
    raises, is taken as down (logged)."""
    said = getattr(part, "rate_limited", None)
    if not callable(said):
        return False
    try:
        return bool(said())
    except Exception as exc:  # noqa: BLE001 - only the kind of refusal depends on it
        log.warning("%s.rate_limited() raised %s: %s; taken as unavailable", type(part).__name__,
                    type(exc).__name__, exc)
        return False


def _waits_for_cloud(req: Request, why: str, when: str, *, spent: str | None = None, limited: bool = False,
                     retry_after_s: float | None = None) -> CloudError:
    """A prompt past the device model's context whose cloud cannot take it now (down, failing,
    rate-limiting (``limited``), its budget spent): a request to retry, not a prompt to shorten (not
    ContextWindowExceededError, which tells an OpenAI client to trim a conversation that the cloud
    takes once it can)."""
    n, limit = req.prompt_tokens, req.context_length
    message = (f"The prompt is {n} tokens, past the device model's context ({limit}, n_ctx), so only "
               f"the cloud can answer it; and {why}. Retry {when}; or shorten the conversation "
               "(drop its oldest turns) for the device to answer it.")
    if spent is not None:
        return CloudBudgetSpentError(message, reason=spent, prompt_tokens=n, context_length=limit,
                                     retry_after_s=retry_after_s)
    if limited:
        return CloudRateLimitError(message, status_code=429, prompt_tokens=n, context_length=limit,
                                   retry_after_s=retry_after_s)
    return CloudUnavailableError(message, prompt_tokens=n, context_length=limit, retry_after_s=retry_after_s)


_REFUSED = (400, 413, 422)  # the cloud refused this request itself (its window, too large): not a retry


def _cannot_continue(exc: NotImplementedError) -> CloudUnavailableError:
    # the edge backend cannot continue the answer the cloud broke off
    return CloudUnavailableError(f"the cloud stream broke mid-answer and {exc}; retry the request")


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
    ) -> None:
        self.backend, self.start, self.call = backend, start, call
        self.route, self.reason, self.score, self.prefix = route, reason, score, prefix
        self.ttft = ttft_ms
        self.restorer = restorer  # the text is restored as it streams: parts hold what the user sees
        self.parts: list[str] = [prefix] if prefix else []
        self.logprobs: list[float] = []
        self.finish_reason, self.usage = "stop", Usage()
        self.stopped = False  # the restorer's stop matcher ended the answer (``_RestoredStop``)

    def feed(self, delta: Delta) -> Chunk | None:
        if delta.logprob is not None:
            self.logprobs.append(delta.logprob)
        if delta.finish_reason is not None:
            self.finish_reason = "stop" if self.stopped else delta.finish_reason
            self.usage = delta.usage or self.usage
            if self.call is not None and delta.usage is not None:
                self.call.usage = delta.usage
        if not delta.text:
            return None
        if self.call is not None:  # until the cloud's own count arrives: ~4 characters a token
            self.call.streamed += estimate_text_tokens(delta.text)
        text = self.restorer.feed(delta.text) if self.restorer is not None else delta.text
        self._note_stop()
        if not text:  # all of it held back: it may be the start of a placeholder
            return None
        if self.ttft is None:  # the first text the caller sees
            self.ttft = (time.perf_counter() - self.start) * 1000
        self.parts.append(text)
        # read per chunk: a cloud learns its model's name from the endpoint
        return Chunk(text, self.route, self.backend.model)

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
        return Chunk(text, self.route, self.backend.model)

    def finish(self) -> Chunk:
        # the sync client's inline path does not flush: what the restorer holds ends the answer
        held = self.flush()
        tail = held.text if held is not None else ""
        usage = self.usage
        mean_lp = sum(self.logprobs) / len(self.logprobs) if self.logprobs and not self.prefix else None
        model = self.backend.model
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
        )
        return Chunk(tail, self.route, model, finish_reason=self.finish_reason, completion=completion)


def _account(stats: Stats, req: Request, c: Completion) -> int:
    """What the request's cloud calls cost (``_CloudCall.cost``, what the ledger counts) goes into
    the answer: its ``cost_usd``; for an answer from a cloud that sent no count, its ``usage``
    (the estimate); and for an answer the device finished (route ``...->edge``) its
    ``usage``, the whole answer the caller got: the prompt once, and as completion the cloud's
    part plus the device's (the device's own count had the prompt and the cloud's part as its
    prompt). Returns the cloud tokens, for the stats (the device's part is not among them)."""
    cloud = Usage()
    for call in req.cloud_calls:
        part = call.cost()
        cloud.prompt_tokens += part.prompt_tokens
        cloud.completion_tokens += part.completion_tokens
    if cloud.total_tokens:
        c.cost_usd = stats.cost(cloud.total_tokens)
        if c.route.endswith("->edge"):
            device = c.usage.completion_tokens
            c.usage = dataclasses.replace(c.usage, prompt_tokens=cloud.prompt_tokens,
                                          completion_tokens=cloud.completion_tokens + device)
        elif not c.usage.total_tokens:  # a cloud that sent no count: the estimate the ledger has
            c.usage = dataclasses.replace(c.usage, prompt_tokens=cloud.prompt_tokens,
                                          completion_tokens=cloud.completion_tokens)
    return cloud.total_tokens


def _tokens_of(hit: Any) -> int:
    """The tokens (prompt and completion) of the call that made a cached answer, as stored with it;
    0 for entries written before they were stored."""
    tokens = (getattr(hit, "metadata", None) or {}).get("tokens")
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else 0
