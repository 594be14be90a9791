"""Exceptions of the cloud server.

    ServerError
    ├── ConfigError            an invalid engine or server setting
    ├── ModelLoadError         the model could not be found or loaded
    ├── InvalidRequestError    bad parameters (HTTP 400)
    │   └── ContextLengthError a prompt or max_tokens beyond the context window (HTTP 400)
    ├── AuthError              missing or wrong API key (HTTP 401)
    ├── ModelNotFoundError     the request names a model this server does not serve (HTTP 404)
    ├── QueueFullError         the waiting queue is full (HTTP 429, Retry-After)
    ├── NotReadyError          the model is still loading (HTTP 503)
    ├── ShuttingDownError      the server is shutting down (HTTP 503)
    └── EngineError            the engine failed while running (HTTP 500)
        └── EngineDeadError    the engine's loop itself failed: nothing more runs (HTTP 500, engine_dead)

The HTTP layer maps these types to OpenAI error JSON; it never matches message text.
"""

from __future__ import annotations


class ServerError(Exception):
    """Base class of every error the cloud server raises on purpose."""


class ConfigError(ServerError):
    pass


class ModelLoadError(ServerError):
    pass


class InvalidRequestError(ServerError):
    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextLengthError(InvalidRequestError):
    pass


class AuthError(ServerError):
    pass


class ModelNotFoundError(ServerError):
    pass


class QueueFullError(ServerError):
    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NotReadyError(ServerError):
    pass


class ShuttingDownError(ServerError):
    pass


class EngineError(ServerError):
    def __init__(self, message: str, *, request_ids: list[str] | None = None) -> None:
        super().__init__(message)
        # a failed step's batch: the requests it failed (None: every request in flight)
        self.request_ids = request_ids


class EngineDeadError(EngineError):
    pass
