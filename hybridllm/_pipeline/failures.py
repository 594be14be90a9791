"""The pipeline's failures: a cloud call that broke, a request no side can answer now."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._exceptions import (
    CloudBudgetSpentError,
    CloudError,
    CloudRateLimitError,
    CloudUnavailableError,
    ContextWindowExceededError,
)

if TYPE_CHECKING:
    from .request import Request


class ForcedCloudOverBudgetError(CloudBudgetSpentError):
    """A forced cloud route met a spent budget where forced routes are held to it
    (``Core.budget_binds_forced_cloud``): refused, sent nowhere. ``retry_after_s``: when the
    budget has room again (the ledger's), as every other spent budget's error says; None for a
    limit of 0 (never)."""

    def __init__(self, reason: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(reason, reason=reason, retry_after_s=retry_after_s)


class _NoOutput(Exception):
    """The cloud failed before streaming anything: safe to answer on the device instead."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _PartialOutput(Exception):
    """The cloud failed after streaming ``text``: the device continues from there."""

    def __init__(self, cause: Exception, text: str, ttft_ms: float | None, model: str | None = None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.text = text
        self.ttft_ms = ttft_ms
        self.model = model  # the model that wrote ``text``, as its deltas named it


def _too_long(req: Request, why: str, what: str) -> ContextWindowExceededError:
    n, limit = req.prompt_tokens, req.context_length
    return ContextWindowExceededError(
        f"The prompt is {n} tokens; the device model's context holds {limit} (n_ctx), at least one "
        f"of them for the answer; and {why}. Shorten the conversation (drop its oldest turns), "
        f"raise n_ctx if the model allows it, {what}.",
        prompt_tokens=n,
        context_length=limit,
    )


def _waits_for_cloud(req: Request, why: str, when: str, *, spent: str | None = None, limited: bool = False,
                     retry_after_s: float | None = None) -> CloudError:
    """A prompt past the device model's context (or a request with tools) whose cloud cannot take
    it now (down, failing, rate-limiting (``limited``), its budget spent): a request to retry, not
    a prompt to shorten (not ContextWindowExceededError, which tells an OpenAI client to trim a
    conversation that the cloud takes once it can)."""
    n, limit = req.prompt_tokens, req.context_length
    if req.tools_need_cloud:
        message = (f"The request gives tools, which only the cloud model calls, so only the cloud can "
                   f"answer it; and {why}. Retry {when}; or send it without tools for the device to "
                   "answer it.")
    else:
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
