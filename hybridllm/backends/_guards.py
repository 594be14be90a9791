"""A backend's own exceptions as hybridllm's: :func:`backend_error`, and the guards that raise it in
their place around a backend's calls and streams, sync and async. The pipeline and the client run
every backend call (a custom ``edge=`` or ``cloud=`` backend's too) through them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from .._exceptions import CloudUnavailableError, EdgeError, HybridLLMError

if TYPE_CHECKING:
    from .base import Delta

T = TypeVar("T")


def backend_error(exc: Exception, backend: object, side: str) -> HybridLLMError:
    """A backend's own exception (a custom ``edge=`` or ``cloud=`` backend's, or a library's that a
    backend let through) as the HybridLLM error of its side, with its type and message in the text;
    the caller raises it ``from exc``, so the original stays its ``__cause__``. A cloud-side one is
    a :class:`CloudUnavailableError`, so the device answers in its place as for the cloud's own
    failures."""
    name = getattr(backend, "name", None) or "backend"
    what = f"{name!r} ({type(backend).__name__})"
    said = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if side == "edge":
        return EdgeError(
            f"The device backend {what} failed: {said}. This is the backend's own error "
            "(its traceback is this error's __cause__): fix that backend or pass another "
            "as edge=."
        )
    return CloudUnavailableError(
        f"The cloud backend {what} failed: {said}. The device answers in its "
        "place where the prompt fits; the backend's own error is this error's "
        "__cause__."
    )


def _ours(exc: BaseException, continuation: bool) -> bool:
    """Raised as it is: hybridllm's own errors, and a backend's NotImplementedError of
    ``stream_continuation`` (the pipeline says the answer cannot be continued)."""
    return isinstance(exc, HybridLLMError) or (continuation and isinstance(exc, NotImplementedError))


def call_guarded(fn: Callable[..., T], backend: object, side: str, *args: Any) -> T:
    """``fn(*args)``, a backend's own exception raised as :func:`backend_error`'s."""
    try:
        return fn(*args)
    except Exception as exc:  # KeyboardInterrupt and friends are BaseException: they pass
        if _ours(exc, False):
            raise
        raise backend_error(exc, backend, side) from exc


def guarded(
    make: Callable[[], Iterable[Delta]], backend: object, side: str, *, continuation: bool = False
) -> Iterator[Delta]:
    """The deltas of ``make()``, a backend's own exception (while making the stream or reading it)
    raised as :func:`backend_error`'s. Closing this closes the backend's stream (``yield from``)."""
    try:
        yield from make()
    except Exception as exc:
        if _ours(exc, continuation):
            raise
        raise backend_error(exc, backend, side) from exc


async def aguarded(
    make: Callable[[], AsyncIterator[Delta]], backend: object, side: str
) -> AsyncGenerator[Delta, None]:
    """:func:`guarded` for an async stream; closing this closes the backend's stream."""
    deltas: AsyncIterator[Delta] | None = None
    try:
        deltas = make()
        async for delta in deltas:
            yield delta
    except Exception as exc:  # asyncio.CancelledError is a BaseException: it passes
        if _ours(exc, False):
            raise
        raise backend_error(exc, backend, side) from exc
    finally:
        close = getattr(deltas, "aclose", None)
        if close is not None:
            await close()
