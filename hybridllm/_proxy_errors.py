"""What an error of the SDK answers over HTTP: status, OpenAI error type and code, and Retry-After."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from fastapi.responses import JSONResponse

from ._client import HybridLLM
from ._exceptions import (
    CloudAuthError,
    CloudBudgetSpentError,
    CloudError,
    CloudRateLimitError,
    ConfigError,
    ContextWindowExceededError,
    EdgeBusyError,
    HybridLLMError,
    InvalidRequestError,
)
from ._pipeline.ports import wait_of
from ._types import Completion
from .wire import error_body

logger = logging.getLogger("hybridllm.proxy")


def status_of(exc: HybridLLMError) -> tuple[int, str, str]:
    """(HTTP status, OpenAI error type, message) for an error of the SDK."""
    if isinstance(exc, InvalidRequestError | ConfigError):
        return 400, "invalid_request_error", str(exc)
    if isinstance(exc, CloudAuthError):
        return 502, "upstream_auth_error", (
            "The cloud refused this proxy's API key; set the key `hybridllm serve` sends to the "
            "cloud (cloud_api_key in the config or HYBRIDLLM_CLOUD_API_KEY)."
        )
    if isinstance(exc, CloudBudgetSpentError):
        # the budget's sentence (when there is room again) and the prompt's numbers: the operator's
        # own limits, nothing of the upstream
        return 429, "requests", str(exc)
    if isinstance(exc, EdgeBusyError):
        return 429, "requests", "The device model is busy; retry shortly."
    if isinstance(exc, CloudRateLimitError):  # the cloud's 429: its wait is the Retry-After
        if exc.prompt_tokens is not None:  # the device could not answer in the cloud's place
            return 429, "requests", (f"The cloud is rate-limiting this server, and {_why_cloud_only(exc)}; "
                                     "retry when the Retry-After header says.")
        return 429, "requests", "The cloud is rate-limiting this server; retry shortly."
    if isinstance(exc, CloudError):
        if exc.prompt_tokens is not None:  # the device could not answer in the cloud's place
            return 503, "upstream_unavailable", (f"The cloud is unavailable, and {_why_cloud_only(exc)}; "
                                                 "retry shortly.")
        return 503, "upstream_unavailable", "The cloud is unavailable; retry shortly."
    return 500, "server_error", "The server had an error while processing your request."


def _why_cloud_only(exc: CloudError) -> str:
    """Why the device could not answer in the cloud's place. The library's error carries the
    prompt's size either way (``_pipeline.failures._waits_for_cloud``): a prompt past the device's
    context, or a request whose tools only the cloud model calls, whose prompt fits (the library's
    ``fits_edge``: the prompt and one answer token). Before, every such error said "past the
    device model's context", for a prompt of a few words that gave tools."""
    n, limit = exc.prompt_tokens, exc.context_length
    if n is not None and limit is not None and n + 1 > limit:
        return (f"the prompt ({n} tokens) is past the device model's context ({limit}, n_ctx), so "
                "the device cannot answer it instead")
    return ("the request gives tools, which only the cloud model calls, so the device cannot answer "
            "it instead (send it without tools for the device to answer it)")


def code_of(exc: BaseException) -> str | None:
    """OpenAI's error ``code`` for an error of the SDK that has one."""
    if isinstance(exc, ContextWindowExceededError):
        return "context_length_exceeded"  # the code OpenAI's clients (and LiteLLM) look for
    if isinstance(exc, CloudBudgetSpentError):
        return "cloud_budget_spent"  # a 429: wait and retry, the prompt is fine
    if isinstance(exc, CloudRateLimitError):
        return "cloud_rate_limited"  # a 429 of the cloud's, not of this server's device or budget
    if isinstance(exc, EdgeBusyError):
        return "rate_limit_exceeded"  # OpenAI's code for its own 429s: the device's queue is full
    return None


def param_of(exc: BaseException) -> str | None:
    """OpenAI's error ``param``: a prompt past the context names the conversation, as OpenAI's own
    ``context_length_exceeded`` does (``"messages"``; this server has no legacy ``prompt`` endpoint)."""
    return "messages" if isinstance(exc, ContextWindowExceededError) else None


def _error(status: int, message: str, etype: str, param: str | None = None,
           code: str | None = None, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, etype, param=param, code=code), status, headers=headers)


def _sdk_error(exc: HybridLLMError, llm: HybridLLM, device: DeviceClock) -> JSONResponse:
    status, etype, message = status_of(exc)
    if status >= 500:
        logger.error("request failed: %s", type(exc).__name__)
    headers = None
    if status in (429, 503):
        headers = {"Retry-After": str(_retry_after_s(exc, llm, device))}
    return _error(status, message, etype, param=param_of(exc), code=code_of(exc), headers=headers)


DEVICE_WAIT_MAX_S = 60  # past a minute a queue estimate is a guess; the client asks again then
CLOUD_WAIT_MAX_S = 300  # the longest the cloud backend leaves an endpoint alone (COOL_MAX_S)
NEVER_S = 3600  # a budget that never has room (a limit of 0): ask again in an hour


def _retry_after_s(exc: HybridLLMError, llm: HybridLLM, device: DeviceClock) -> int:
    """Retry-After (whole seconds, rounded up, at least 1) for a 429 or 503, from what is known:
    - a spent budget: when its sliding windows have room again (the error's, else the ledger's);
    - a busy device: the queue ahead served one answer at a time, (waiting + the running one) x
      the device's recent time per answer (the error's, from the worker's own timing, else
      ``DeviceClock``'s; 1 s before one is timed), at most ``DEVICE_WAIT_MAX_S``;
    - the cloud: its own Retry-After or its circuit's cooldown (the error's, else the soonest
      endpoint's), at most ``CLOUD_WAIT_MAX_S``; 1 s when nothing is known."""
    wait: float | None
    if isinstance(exc, CloudBudgetSpentError):
        wait = exc.retry_after_s
        if wait is None:
            wait = wait_of(llm._core.ledger)
        return _whole_s(wait, unknown=NEVER_S)
    if isinstance(exc, EdgeBusyError):
        wait = exc.retry_after_s
        if wait is None:
            ahead = llm._core.edge_worker.num_waiting + 1
            wait = ahead * (device.service_s or 1.0)
        return _whole_s(wait, unknown=1, cap=DEVICE_WAIT_MAX_S)
    wait = exc.retry_after_s if isinstance(exc, CloudError) else None
    if wait is None:
        wait = wait_of(llm._core.cloud)
    return _whole_s(wait, unknown=1, cap=CLOUD_WAIT_MAX_S)


def _whole_s(wait: float | None, *, unknown: int, cap: int | None = None) -> int:
    """``wait`` in whole seconds, rounded up, at least 1 and at most ``cap``; ``unknown`` for None
    or NaN. A custom cloud's ``retry_after_s()`` (or its error's) may say inf or NaN, which
    ``math.ceil`` refuses: that turned the 429/503 into a 500. inf is "very long": ``cap``, or
    ``unknown`` where there is none (a budget: ask again in an hour); -inf is no wait."""
    if wait is None or math.isnan(wait) or (cap is None and wait == math.inf):
        return unknown
    return max(1, math.ceil(min(max(wait, 0.0), math.inf if cap is None else cap)))


class DeviceClock:
    """The device model's recent time per answer, for a busy device's Retry-After."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.service_s: float | None = None
        self._last_end: float | None = None

    def record(self, c: Completion) -> None:
        if c.route.split(" ")[0] != "edge":  # "edge", "edge (cloud unavailable)": the device alone
            return
        now = self.clock()
        latency = c.latency_ms / 1000
        # the device answers one request at a time: it started this one when the request came or
        # when the previous answer ended, whichever was later, so the answer took the smaller of
        # its latency and the time since that end (a wait in the queue is not the device's time)
        took = latency if self._last_end is None else min(latency, now - self._last_end)
        self._last_end = now
        # a moving average: the newest answer weighs a quarter, so the estimate follows load
        self.service_s = took if self.service_s is None else 0.75 * self.service_s + 0.25 * took


def retry_after(part: Any, *, never: int) -> str:
    """Retry-After from ``part.retry_after_s()`` (the budget ledger: when its sliding windows have
    room again; the cloud backend: when an endpoint's circuit lets a request through), in whole
    seconds rounded up, at least 1; ``never`` when it says None or cannot say."""
    return str(_whole_s(wait_of(part), unknown=never))
