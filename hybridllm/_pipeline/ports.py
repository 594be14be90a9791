"""What the pipeline needs of its parts: the cache, policy and ledger ports, Retry-After hints."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .._types import Decision, Message, Messages

if TYPE_CHECKING:
    from .._stats import Stats
    from ..backends.base import Backend
    from ..backends.worker import EdgeWorker

log = logging.getLogger("hybridllm")


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


class _CoreParts:
    """The parts the pipeline's core holds (set in ``Core.__init__``), as its steps read them."""

    edge: Backend
    cloud: Backend | None
    cache: CachePort | None
    policy: PolicyPort | None
    ledger: LedgerPort | None
    namespace: str
    cache_min_logprob: float | None
    stats: Stats
    cache_model: str
    edge_worker: EdgeWorker
    budget_binds_forced_cloud: bool
    _cache_write_failed: bool
    _cache_embed_failed: bool
