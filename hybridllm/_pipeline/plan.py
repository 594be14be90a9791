"""The plan step (2): the prompt counted, policy + router -> one Decision, the budget reserved."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from typing import Any

from .._exceptions import HybridLLMError, InvalidRequestError, RouterError
from .._tool_plan import plan_of
from .._types import Decision, estimate_text_tokens, estimate_tokens
from ..backends.base import DeviceBackend, call_guarded
from .failures import ForcedCloudOverBudgetError, _too_long, _waits_for_cloud
from .ports import _CoreParts, wait_of
from .request import Request


class _Planner(_CoreParts):
    # 2. plan
    async def _plan(self, req: Request, vec: Any) -> Decision:
        msgs, opts = req.messages, req.options
        if self.cloud is None:  # the device's own check refuses a prompt past its context
            return Decision("edge", "edge: no cloud configured", messages_for_cloud=msgs)
        loop = asyncio.get_running_loop()
        # counted once, with the device's tokenizer: the context check, the router and the
        # budget's estimate read this one count
        count = self.edge.count_tokens
        shown = plan_of(req.params) if req.edge_tools else None
        if shown is not None and isinstance(self.edge, DeviceBackend):
            # the device's prompt holds the tools too (its template lists them): counted with them,
            # so that a conversation the tools push past its context goes to the cloud
            count = functools.partial(self.edge.count_tokens, tools=shown.tools)
            req.tools_in_count = True
        req.prompt_tokens = await loop.run_in_executor(None, call_guarded, count, self.edge, "edge", msgs)
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
            # a request with tools goes to the cloud whatever the router would score: asked as a
            # forced one, so that only the policy's privacy rules run (_tools_to_the_cloud)
            force = "cloud" if req.tools_need_cloud else opts.route
            d = await loop.run_in_executor(
                None, _ask_policy, policy, "decide",
                lambda: policy.decide(msgs, force=force, prompt_tokens=tokens, embedding=vec),
            )
            if not isinstance(d, Decision):  # else an AttributeError on .route, far from its cause
                raise RouterError(f"The routing policy {type(policy).__name__}.decide() returned "
                                  f"{type(d).__name__}, not a hybridllm.Decision; nothing was sent.")
        if req.tools_need_cloud:
            d = _tools_to_the_cloud(d, forced=opts.route == "cloud")
        elif not req.fits_edge:
            d = self._beyond_the_edge(req, d)
        elif opts.cascade is not None:
            d = dataclasses.replace(
                d, cascade=bool(opts.cascade and d.route == "edge" and d.score is not None and not d.forced)
            )
        if req.calls_tools and d.cascade:  # a held-back draft replays text, not calls
            d = dataclasses.replace(d, cascade=False)
        binds = not d.forced or self.budget_binds_forced_cloud
        if d.route == "cloud" and binds and self.ledger is not None:
            # one step under the ledger's lock: of concurrent requests, only as many as fit pass
            req.reservation, spent = self.ledger.reserve(self._estimate(req))
            if spent and d.forced:  # the caller chose the cloud: refused, not moved to the device
                raise ForcedCloudOverBudgetError(spent, retry_after_s=wait_of(self.ledger))
            if spent:
                if not req.edge_can_answer:  # the device cannot stand in: wait for the budget
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
        # the tools are in the cloud's prompt too (its template lists them): ~4 characters a token
        listed = req.params.tools and not req.tools_in_count
        tools = estimate_text_tokens(json.dumps(req.params.tools)) if listed else 0
        if req.prompt_tokens is not None:
            return req.prompt_tokens + tools
        return estimate_tokens(req.messages) + tools  # an edge without a tokenizer: ~4 characters a token

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


def _tools_to_the_cloud(d: Decision, *, forced: bool) -> Decision:
    """A request with tools goes to the cloud, unscored (only the cloud model calls tools), unless
    privacy keeps it on the device: then a clear error. ``forced``: the caller chose the cloud
    (else the request is held to the budget as any routed one)."""
    if d.private:
        found = f"it contains {', '.join(d.pii_kinds)}" if d.pii_kinds else d.reason
        raise InvalidRequestError(
            f"privacy keeps this request on the device ({found}), and only the cloud model calls "
            "tools: set privacy='redact' to send the cloud placeholders instead of the values, or "
            "leave out tools for the device to answer.")
    if forced:
        reason = f"forced cloud by the caller{_redacted(d)}"
    else:
        reason = f"tools: only the cloud model calls them{_redacted(d)}"
    return dataclasses.replace(d, route="cloud", reason=reason, cascade=False, forced=forced, score=None)


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

def _redacted(d: Decision) -> str:
    """The reason's note for a request the cloud is sent with placeholders for its values."""
    from ..router.privacy import redaction_note

    return redaction_note(d.pii_kinds) if d.placeholders else ""


def _sent_nowhere(d: Decision) -> str:
    """A cloud decision's reason for the device's answer after all (budget spent, cloud down):
    nothing was sent, so no note that values were redacted for the cloud."""
    note = _redacted(d)
    return d.reason.replace(note, "") if note else d.reason
