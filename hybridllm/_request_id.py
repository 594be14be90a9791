"""The id of the HTTP request being served: set by ``wire.middleware.RequestId`` (``hybridllm serve``
and ``hybridllm-cloud``) and read where the request travels on (the cloud backend sends it as
``X-Request-Id``; the servers' log lines name it). Standard library only: the light client and the
cloud backend import it without the server's packages."""

from __future__ import annotations

from contextvars import ContextVar

REQUEST_ID: ContextVar[str | None] = ContextVar("hybridllm_request_id", default=None)
