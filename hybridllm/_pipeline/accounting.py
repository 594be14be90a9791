"""What a request's cloud calls cost: settled in the budget ledger, and put in the answer and the stats."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from .._stats import Stats
from .._types import Completion, Usage, is_number, is_real
from ..backends.base import Backend
from ..router.budget import MAX_TOKENS
from .ports import _CoreParts
from .request import Request

log = logging.getLogger("hybridllm")
_ENERGY = ("energy_j", "co2_g", "co2_saved_g")  # co2_saved_g may be negative: a dirtier grid


class _Accounting(_CoreParts):
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


def checked_usage(usage: object, backend: Backend, side: str) -> Usage:
    """A backend's usage as the pipeline counts it: a figure that is not a number, or is NaN,
    infinite or negative, is unknown for this request, as from a server that reports none: an
    energy or CO2 figure None (out of ``stats()``'s totals), a token count 0 (the pipeline
    estimates the call's tokens); one warning names the backend. Before, a custom cloud's NaN
    energy made ``stats()["cloud_energy_j"]`` NaN for good, and a NaN count failed the request
    with the budget's ConfigError. A usage that is not a :class:`Usage` at all (a dict, a number)
    is wholly unknown the same way (it failed the request with an AttributeError)."""
    if not isinstance(usage, Usage):
        log.warning("the %s backend %s sent a usage of type %s, not a hybridllm.Usage: unknown for "
                    "this request, as when none is reported (yield Delta(..., usage=Usage("
                    "prompt_tokens=..., completion_tokens=...)))", side, _named(backend),
                    type(usage).__name__)
        return Usage()
    counts = (usage.prompt_tokens, usage.completion_tokens)
    bad = {k: getattr(usage, k) for k in _ENERGY if not _figure(getattr(usage, k), k == "co2_saved_g")}
    if not (all(is_real(n) and n >= 0 for n in counts) and sum(counts) < MAX_TOKENS):
        bad.update(prompt_tokens=counts[0], completion_tokens=counts[1])
    if not bad:
        return usage
    log.warning("the %s backend %s reported %s in its usage (not a finite number, or below 0): "
                "unknown for this request, as when none is reported", side, _named(backend),
                ", ".join(f"{k}={v!r}" for k, v in bad.items()))
    unknown: dict[str, Any] = {k: None for k in bad if k in _ENERGY}
    if "energy_j" in bad:
        unknown["energy_source"] = None
    if "prompt_tokens" in bad:
        unknown.update(prompt_tokens=0, completion_tokens=0)
    return dataclasses.replace(usage, **unknown)


def _named(backend: Backend) -> str:
    """How a warning names a backend: its name and its class (``'metered' (MyCloud)``)."""
    return f"{getattr(backend, 'name', None) or 'backend'!r} ({type(backend).__name__})"


def _figure(value: Any, signed: bool) -> bool:
    """None (not reported) or a number finite as a float, >= 0 unless ``signed``."""
    return value is None or (is_number(value) and (signed or value >= 0))


def _tokens_of(hit: Any) -> int:
    """The tokens (prompt and completion) of the call that made a cached answer, as stored with it;
    0 for entries written before they were stored."""
    tokens = (getattr(hit, "metadata", None) or {}).get("tokens")
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else 0
