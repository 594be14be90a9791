"""The backend interface: something that turns messages into streamed text.

A backend streams :class:`Delta` pieces and ends with one whose ``finish_reason`` is set and which
carries the usage. ``generate`` is built on ``stream`` so each backend writes the loop once.
Backends register by name so configuration can pick them ("llama_cpp", "cloud", "fake").

Beside this module: ``_guards.py`` (a backend's own errors as hybridllm's, around its calls and
streams) and ``_device_support.py`` (what the device backends share: the settings check, the
stop-string matcher, returning freed memory); their names are importable from here.
"""

from __future__ import annotations

import asyncio
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._exceptions import ContextWindowExceededError
from .._message_text import calls_for_template
from .._types import USER_TEXT, GenerationParams, Messages, Usage, private_repr
from ..prompts import PromptFormat
from ._device_support import (  # noqa: F401 - re-exported: the device backends and tests import them here
    _MAX_THREADS,
    StopMatcher,
    check_device_settings,
    return_freed_memory,
)
from ._guards import aguarded, backend_error, call_guarded, guarded  # noqa: F401 - re-exported (the pipeline)

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
