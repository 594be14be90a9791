"""The backend interface: something that turns messages into streamed text.

A backend streams :class:`Delta` pieces and ends with one whose ``finish_reason`` is set and which
carries the usage. ``generate`` is built on ``stream`` so each backend writes the loop once.
Backends register by name so configuration can pick them ("llama_cpp", "cloud", "fake").
"""

from __future__ import annotations

import asyncio
import ctypes
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from .._cpus import usable_cpus
from .._exceptions import (
    CloudUnavailableError,
    ConfigError,
    ContextWindowExceededError,
    EdgeError,
    HybridLLMError,
)
from .._message_text import calls_for_template
from .._types import USER_TEXT, GenerationParams, Messages, Usage, private_repr
from ..prompts import PromptFormat

if TYPE_CHECKING:
    from .._tools import ToolCallDelta


@dataclass
class Delta:
    text: str = field(metadata=USER_TEXT)  # (in repr by its length only)
    finish_reason: str | None = None  # set on the last delta: "stop" or "length"
    usage: Usage | None = None  # set on the last delta
    logprob: float | None = None  # log-probability of this piece's tokens, when known
    model: str | None = None  # the model that wrote it, where endpoints serve different ones
    tool_calls: list[ToolCallDelta] | None = None  # pieces of the answer's tool calls (the cloud's)

    __repr__ = private_repr


@dataclass
class Generation:
    text: str = field(metadata=USER_TEXT)  # (in repr by its length only)
    finish_reason: str
    usage: Usage
    ttft_ms: float | None
    latency_ms: float
    mean_logprob: float | None = None
    extra: dict = field(default_factory=dict)

    __repr__ = private_repr


class Backend(ABC):
    """Generates and streams answers for OpenAI-style messages."""

    name: str = "backend"
    model: str = ""

    @abstractmethod
    def stream(self, messages: Messages, params: GenerationParams) -> Iterator[Delta]:
        """Yield text pieces as they are produced. Closing the iterator stops generation."""

    def stream_continuation(self, messages: Messages, prefix: str,
                            params: GenerationParams) -> Iterator[Delta]:
        """Continue an assistant answer that begins with ``prefix`` (text another backend already
        streamed); yields only the new text. Used when a cloud stream breaks mid-answer."""
        raise NotImplementedError(f"the {self.name} backend cannot continue another answer")

    def generate(self, messages: Messages, params: GenerationParams) -> Generation:
        start = time.perf_counter()
        ttft: float | None = None
        parts: list[str] = []
        logprobs: list[float] = []
        finish, usage = "stop", Usage()
        for delta in self.stream(messages, params):
            if delta.text:
                if ttft is None:
                    ttft = (time.perf_counter() - start) * 1000
                parts.append(delta.text)
            if delta.logprob is not None:
                logprobs.append(delta.logprob)
            if delta.finish_reason is not None:
                finish = delta.finish_reason
                usage = delta.usage or usage
        mean_lp = sum(logprobs) / len(logprobs) if logprobs else None
        return Generation("".join(parts), finish, usage, ttft,
                          (time.perf_counter() - start) * 1000, mean_lp)

    async def astream(self, messages: Messages, params: GenerationParams) -> AsyncIterator[Delta]:
        """``stream`` for async callers. This default steps the sync stream in a worker thread;
        a backend with async I/O (the cloud) overrides it. The pipeline runs device backends on
        their own thread (:mod:`.worker`) and does not use this for them."""
        loop = asyncio.get_running_loop()
        it = iter(self.stream(messages, params))
        # a cancelled wait leaves next() running on its thread: close() must wait for it to return
        # (closing a generator while it runs raises "generator already executing")
        busy = threading.Lock()

        def step() -> Delta | None:
            with busy:
                return next(it, None)

        def close() -> None:
            with busy:
                getattr(it, "close", lambda: None)()

        try:
            while (delta := await loop.run_in_executor(None, step)) is not None:
                yield delta
        finally:
            await loop.run_in_executor(None, close)

    def is_available(self) -> bool:
        """False while the backend knows it cannot answer (the cloud's circuit is open)."""
        return True

    def count_tokens(self, messages: Messages) -> int | None:
        """Prompt length in this backend's tokens, when it can tell cheaply."""
        return None

    def calls_tools(self) -> bool:
        """Whether this model can be given ``tools`` and its answer read as calls (a device model
        whose chat template lists tools; see :mod:`hybridllm._tools`). Off by default: a request
        with tools goes to the cloud."""
        return False

    @property
    def context_length(self) -> int | None:
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the model or the connection."""

    async def aclose(self) -> None:
        """``close`` from async code (the cloud closes its connections on the running loop)."""
        self.close()



class DeviceBackend(Backend):
    """A backend that renders and tokenizes the prompt itself (llama.cpp, ONNX Runtime).

    Subclasses set ``prompt_format`` and give ``tokenize``, ``context_length`` and ``_run`` (the
    token loop); the prompt, the stop strings and the context check are written here once.
    """

    prompt_format: PromptFormat

    @abstractmethod
    def tokenize(self, messages: Messages, *, prefix: str = "",
                 tools: list[dict[str, Any]] | None = None) -> list[int]: ...

    def calls_tools(self) -> bool:
        # its template lists tools (Qwen2.5's does, SmolLM2's does not): the model was taught a
        # call format, which the pipeline reads (hybridllm._tool_answers.ToolCallReader)
        return self.prompt_format.renders_tools()

    @abstractmethod
    def _run(self, tokens: list[int], params: GenerationParams,
             stops: tuple[str, ...]) -> Iterator[Delta]: ...

    def render(self, messages: Messages) -> str:
        return self.prompt_format.render(messages)

    def count_tokens(self, messages: Messages, *, tools: list[dict[str, Any]] | None = None) -> int:
        """The prompt's tokens; ``tools``: as the template lists them too (a request with tools)."""
        turns = calls_for_template(messages)
        return len(self.tokenize(turns, tools=tools) if tools else self.tokenize(turns))

    def stream(self, messages: Messages, params: GenerationParams) -> Iterator[Delta]:
        return self._stream(messages, params, "")

    def stream_continuation(self, messages: Messages, prefix: str,
                            params: GenerationParams) -> Iterator[Delta]:
        # the rendered prompt ends with the assistant turn's opening, so the prefix reads as the
        # start of this model's own answer; up to max_tokens new tokens follow it (the prefix's
        # tokens are not counted against max_tokens). A structured answer goes on from the
        # prefix's place in its format's grammar (a backend's ``_formats``: backends/structured.py;
        # _run reads the prefix when it starts the request's constraint, before it returns)
        formats = getattr(self, "_formats", None)
        if formats is None or getattr(params, "response_format", None) is None:
            return self._stream(messages, params, prefix)
        with formats.continuing(prefix):
            return self._stream(messages, params, prefix)

    def _stream(self, messages: Messages, params: GenerationParams, prefix: str) -> Iterator[Delta]:
        stops = tuple(dict.fromkeys(params.stop + self.prompt_format.stops(messages)))
        from .._tool_plan import plan_of

        plan = plan_of(params)  # the tools reach the template unless tool_choice is "none"
        turns = calls_for_template(messages)  # earlier calls' arguments as objects, as the servers pass them
        tokens = (self.tokenize(turns, prefix=prefix, tools=plan.tools) if plan is not None
                  else self.tokenize(turns, prefix=prefix))
        limit = self.context_length
        if limit is not None and len(tokens) >= limit:  # no room left for one answer token
            raise ContextWindowExceededError(
                f"The prompt is {len(tokens)} tokens; the device model's context holds {limit} "
                "(n_ctx), at least one of them for the answer. Shorten the conversation (drop its "
                "oldest turns), raise n_ctx if the model allows it, or configure a cloud "
                "(cloud_url=...) to take long prompts.",
                prompt_tokens=len(tokens),
                context_length=limit,
            )
        return self._run(tokens, params, stops)

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
        return EdgeError(f"The device backend {what} failed: {said}. This is the backend's own error "
                         "(its traceback is this error's __cause__): fix that backend or pass another "
                         "as edge=.")
    return CloudUnavailableError(f"The cloud backend {what} failed: {said}. The device answers in its "
                                 "place where the prompt fits; the backend's own error is this error's "
                                 "__cause__.")


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


def guarded(make: Callable[[], Iterable[Delta]], backend: object, side: str, *,
            continuation: bool = False) -> Iterator[Delta]:
    """The deltas of ``make()``, a backend's own exception (while making the stream or reading it)
    raised as :func:`backend_error`'s. Closing this closes the backend's stream (``yield from``)."""
    try:
        yield from make()
    except Exception as exc:
        if _ours(exc, continuation):
            raise
        raise backend_error(exc, backend, side) from exc


async def aguarded(make: Callable[[], AsyncIterator[Delta]], backend: object,
                   side: str) -> AsyncGenerator[Delta, None]:
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


async def drain_loop(*, cancel: bool = False, timeout_s: float = 5.0, rounds: int = 3) -> None:
    """On a loop about to stop: let the tasks still pending on it end (first cancelled, with
    ``cancel``: the steps still running), and close its suspended async generators. Closing them
    starts tasks of their own (httpx's line readers are closed by tasks), so this repeats, up to
    ``rounds`` times, until none is left; a task closed unrun prints "Task was destroyed but it is
    pending!". Used by the cloud's synchronous stream and the sync client's close."""
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    for i in range(rounds):
        tasks = [t for t in asyncio.all_tasks(loop) if t is not me]
        if cancel and i == 0:
            for task in tasks:
                task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        await loop.shutdown_asyncgens()
        if not any(t is not me for t in asyncio.all_tasks(loop)):
            return


BackendFactory = Callable[..., Backend]
_REGISTRY: dict[str, BackendFactory] = {}


def register_backend(name: str, factory: BackendFactory) -> None:
    _REGISTRY[name] = factory


def create_backend(name: str, **kwargs: object) -> Backend:
    from .._exceptions import ConfigError

    if name not in _REGISTRY:
        _load_builtin(name)
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"Unknown backend {name!r}; available: {', '.join(sorted(_REGISTRY)) or 'none'}."
        ) from None
    return factory(**kwargs)


def _load_builtin(name: str) -> None:
    import importlib

    modules = {"llama_cpp": ".llama_cpp", "fake": ".fake", "cloud": ".cloud", "onnx": ".onnx"}
    if name in modules:
        try:
            importlib.import_module(modules[name], __package__)
        except ImportError:
            pass


_MAX_THREADS = 512  # GGML_MAX_N_THREADS: llama.cpp's own limit (past it a decode crawled or hung)


def check_device_settings(n_ctx: Any, n_threads: Any, n_batch: Any = 1) -> None:
    """Refuse device-model settings llama.cpp would crash on, hang on or blame on the model file;
    both device backends check them by these rules, before anything loads (the ONNX backend has
    no n_batch)."""
    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not whole(n_ctx) or n_ctx < 0:
        raise ConfigError(
            f"n_ctx must be a whole number of tokens (0: the model's own context length), got {n_ctx!r}.")
    if n_threads is not None and (not whole(n_threads) or not 1 <= n_threads <= _MAX_THREADS):
        raise ConfigError(
            f"n_threads must be a whole number from 1 to {_MAX_THREADS} (leave it out for all "
            f"{usable_cpus()} cores this process may use), got {n_threads!r}.")
    if not whole(n_batch) or n_batch < 1:
        raise ConfigError(f"n_batch must be a whole number of tokens, at least 1, got {n_batch!r}.")


class StopMatcher:
    """Holds back text that may be the start of a stop string; cuts at the first full match. Shared by
    the device backends, the cloud client (a model that refuses ``stop``) and the pipeline (stops
    matched in restored text under privacy="redact")."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was hit)."""
        buf = self.pending + text
        if not self.stops:
            self.pending = ""
            return buf, False
        # the match that ends first, as text fed one character at a time would meet it (the
        # earlier start where two end together): cutting at the earliest start instead let a long
        # stop found whole in one piece win over a short one inside it that ends sooner, so the
        # answer depended on how the text was split into pieces
        hits = [(i + len(s), i) for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            self.pending = ""
            return buf[: min(hits)[1]], True
        hold = 0
        for stop in self.stops:  # longest suffix of buf that is a proper prefix of a stop
            for k in range(min(len(stop) - 1, len(buf)), hold, -1):
                if buf.endswith(stop[:k]):
                    hold = k
                    break
        self.pending = buf[len(buf) - hold:] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def return_freed_memory() -> bool:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``), for a device
    backend's close(); False where the C library has none (macOS, musl).

    A model's runtime state (ONNX Runtime's repacked weights and KV cache, llama.cpp's vocabulary,
    graph and sampler) lives in many heap allocations under glibc's mmap threshold; freeing them
    leaves the pages in the process. Closing an ONNX SmolLM2 backend kept about 200 MB of the 360 MB
    it had added, and each load-and-close cycle kept more (232, 262, 298 MB after three); with the
    trim the process went back to within 55 MB of where it began (llama.cpp: 22-35 MB, now 5-9).
    """
    if sys.platform != "linux":
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
