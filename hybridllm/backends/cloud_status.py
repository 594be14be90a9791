"""What a failed answer means: the retryable failures, the verdict on an HTTP status, Retry-After."""

from __future__ import annotations

import datetime
import email.utils
import logging
import math
import re
import time
from typing import Any

from .._exceptions import CloudAuthError, CloudUnavailableError, InvalidRequestError
from .._masking import public_text
from .circuit import Endpoint

log = logging.getLogger("hybridllm.cloud")
RETRY_STATUS = {408, 409, 429}  # and every 5xx: a proxy's 520-524 (Cloudflare) or 529 (overloaded) too
# the cloud's context-window refusal: OpenAI's (and our server's) code, or the wording of servers
# that send none (vLLM: "maximum context length", others: "context window", "prompt is too long")
CONTEXT_WORDS = re.compile(r"context[ _-]?(length|window)|prompt is too long", re.IGNORECASE)
# a 422 is a window refusal only when it says so: those words, or what servers that answer a long
# prompt with 422 write (TGI: "`inputs` tokens + `max_new_tokens` must be <= 2048", "`inputs` must
# have less than 1024 tokens"; others "maximum input length", "too many tokens"); any other 422 (a
# validation error: "Input should be less than or equal to 4096") is the request's fault
WINDOW_422_WORDS = re.compile(
    r"context[ _-]?(length|window)|prompt is too long|max(imum)?[ _-](input|sequence|prompt|model)[ _-]"
    r"length|too many (input |prompt )?tokens|inputs.{0,80}must (be <=|have less than)",
    re.IGNORECASE)


class _Retryable(Exception):
    def __init__(self, message: str, *, status: int | None = None,
                 retry_after: float | None = None, cause: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        # what the cloud did, in a few words, for the reasons given while its circuit stays open
        self.cause = cause or (message if len(message) <= 160 else message[:157] + "...")


class _EndpointDown(_Retryable):
    """The endpoint cannot serve at all (unreachable, or not an OpenAI-compatible API): its circuit
    opens at once and the request moves on to another endpoint, or to the device."""


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        seconds = float(value)
        return max(0.0, seconds) if math.isfinite(seconds) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000" parses naive; HTTP dates are GMT, not the machine's zone
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - time.time())


def retry_after_of(headers: Any) -> float | None:
    """Seconds to wait from an answer's headers: ``retry-after-ms`` (OpenAI's and Azure's, in
    milliseconds, finer than whole seconds) when it is a number >= 0, else ``Retry-After``. Either
    is bounded where it is used (``backoff_max_s`` waited, ``COOL_MAX_S`` at most left alone)."""
    try:
        ms = float(headers.get("retry-after-ms") or "")
    except ValueError:  # absent, or not a number: Retry-After decides
        ms = math.nan
    if math.isfinite(ms) and ms >= 0:
        return ms / 1000
    return parse_retry_after(headers.get("retry-after"))


def _error_of(resp: Any) -> tuple[str, str]:
    """(message, code) of an error answer: OpenAI's ``{"error": {"message", "code"}}``, else its
    text (a proxy's page, FastAPI's ``{"detail": ...}``)."""
    try:
        error = resp.json().get("error")
    except (ValueError, AttributeError):  # not JSON, or JSON that is not an object
        error = None
    if isinstance(error, dict):
        return str(error.get("message") or error)[:300], str(error.get("code") or "")
    if isinstance(error, str):
        return error[:300], ""
    return " ".join(resp.text[:200].split()), ""



class _StatusVerdicts:
    """The verdicts of :class:`~hybridllm.backends.cloud.CloudBackend` on an endpoint that failed."""

    connect_timeout_s: float
    _warned: set[tuple[str, int]]

    def _unreachable(self, ep: Endpoint, exc: Exception) -> _EndpointDown:
        """A connection that could not be made (refused, timed out, a name that does not resolve)."""
        import httpx

        if isinstance(exc, httpx.ConnectTimeout):
            why = f"no connection within {self.connect_timeout_s:g} s (ConnectTimeout)"
        else:
            why = f"{str(exc)[:120] or 'the connection failed'} ({type(exc).__name__})"
        return _EndpointDown(f"The cloud at {ep.base_url} cannot be reached: {why}",
                             cause=f"{why} to {ep.base_url}")

    def _warn_once(self, url: str, status: int, message: str) -> None:
        """A status that says the endpoint is misconfigured: a warning the first time per endpoint,
        so it stays visible though the device answers."""
        if (url, status) in self._warned:
            return
        self._warned.add((url, status))
        log.warning("%s; the device answers instead (logged once for %s)", message, url)

    def _raise_for_status(self, resp: Any, url: str = "", *, listing: bool = False) -> None:
        """Raise what a non-200 answer means (see ``backends/cloud.py``'s docstring). ``listing``: the answer
        to GET /models, which carries no request of the caller's to refuse."""
        status = resp.status_code
        message, code = _error_of(resp)
        try:
            # without its query string: it may carry a key (``?key=``, Azure's ``?code=``), and this
            # goes into errors, warnings and the reasons of answers from the device
            where = str(resp.request.url.copy_with(query=None))
        except RuntimeError:  # a response built without its request
            where = url
        cause = f"HTTP {status} from {where}"
        if status in RETRY_STATUS or status >= 500:  # the endpoint named: several may be balanced
            raise _Retryable(f"HTTP {status}: {message} (from {where})", status=status, cause=cause,
                             retry_after=retry_after_of(resp.headers))
        if status in (401, 403):
            raise CloudAuthError(
                f"The cloud refused the API key (HTTP {status}); set HYBRIDLLM_CLOUD_API_KEY "
                "or pass cloud_api_key=...", status_code=status)
        if not listing and status == 400 and (code == "context_length_exceeded"
                                              or CONTEXT_WORDS.search(message)):
            raise CloudUnavailableError(f"the cloud's context window cannot take this prompt (HTTP 400 "
                                        f"context_length_exceeded: {message})", status_code=400)
        if not listing and status == 400:
            raise InvalidRequestError(f"The cloud rejected the request (HTTP 400): {message}")
        if not listing and status == 422 and not (code == "context_length_exceeded"
                                                  or WINDOW_422_WORDS.search(message)):
            raise InvalidRequestError(f"The cloud rejected the request (HTTP 422, unprocessable): "
                                      f"{message}")
        if not listing and status in (413, 422):  # too large, or too long for its context window
            what = "too large" if status == 413 else "too long for its context window"
            text = f"The cloud at {where} answered HTTP {status} (request {what}): {message}"
            self._warn_once(url or where, status, text)
            raise CloudUnavailableError(text, status_code=status)
        if 300 <= status < 400:

            # where it points, without its query string or fragment (a captive portal's token) and
            # with a user:password@ in it masked, as the endpoint's own URL above
            to = re.split(r"[?#]", resp.headers.get("location") or "", maxsplit=1)[0]
            raise _EndpointDown(f"The cloud at {where} answered HTTP {status}, a redirect to "
                                f"{public_text(to) or 'nowhere'}: set cloud_url to the "
                                "address it points to (redirects are not followed)", status=status,
                                cause=f"{cause}, a redirect")
        raise _EndpointDown(f"The cloud at {where} answered HTTP {status}: {message} (is cloud_url the "
                            "base URL of an OpenAI-compatible server?)", status=status, cause=cause)
