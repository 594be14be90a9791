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
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from .._exceptions import ContextWindowExceededError
from .._types import GenerationParams, Messages, Usage
from ..prompts import PromptFormat


@dataclass
class Delta:
    text: str
    finish_reason: str | None = None  # set on the last delta: "stop" or "length"
    usage: Usage | None = None  # set on the last delta
    logprob: float | None = None  # log-probability of this piece's tokens, when known


@dataclass
class Generation:
    text: str
    finish_reason: str
    usage: Usage
    ttft_ms: float | None
    latency_ms: float
    mean_logprob: float | None = None
    extra: dict = field(default_factory=dict)


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
    def tokenize(self, messages: Messages, *, prefix: str = "") -> list[int]: ...

    @abstractmethod
    def _run(self, tokens: list[int], params: GenerationParams,
             stops: tuple[str, ...]) -> Iterator[Delta]: ...

    def render(self, messages: Messages) -> str:
        return self.prompt_format.render(messages)

    def count_tokens(self, messages: Messages) -> int:
        return len(self.tokenize(messages))

    def stream(self, messages: Messages, params: GenerationParams) -> Iterator[Delta]:
        return self._stream(messages, params, "")

    def stream_continuation(self, messages: Messages, prefix: str,
                            params: GenerationParams) -> Iterator[Delta]:
        # the rendered prompt ends with the assistant turn's opening, so the prefix reads as the
        # start of this model's own answer; up to max_tokens new tokens follow it (the prefix's
        # tokens are not counted against max_tokens)
        return self._stream(messages, params, prefix)

    def _stream(self, messages: Messages, params: GenerationParams, prefix: str) -> Iterator[Delta]:
        stops = tuple(dict.fromkeys(params.stop + self.prompt_format.stops(messages)))
        tokens = self.tokenize(messages, prefix=prefix)
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
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.pending = ""
            return buf[:cut], True
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
