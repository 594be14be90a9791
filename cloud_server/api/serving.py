"""Turn validated OpenAI requests into engine requests, and engine outputs into OpenAI responses.

A request is tokenized here (the chat template rendered by the engine's tokenizer), checked
against the context window, and admitted by pulling its first output before anything is sent:
that way a full queue or an over-long prompt is still an HTTP error with a status, not a broken
stream. Every exit path (finish, error, client gone) closes the engine iterator and aborts the
request if it had not finished, so its KV blocks go back to the pool.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import (
    ContextLengthError,
    EngineError,
    InvalidRequestError,
    QueueFullError,
    ServerError,
)
from hybridllm.wire.responses import DONE, ChunkWriter, chat_completion, error_event, text_completion

from .errors import error_body, error_kind
from .metrics import RequestTimer, ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest

logger = logging.getLogger("cloud_server.api")

# The engine's ends that are an answer; its others ("abort": dropped by the engine, "error") are
# no finish reason OpenAI's types allow, and the text they end is cut short: an error instead.
_ANSWER_ENDS = frozenset({"stop", "length", None})


class Engine(Protocol):
    """The part of ``AsyncLLMEngine`` the API uses (a fake implements it in the tests)."""

    is_ready: bool
    model_name: str
    max_model_len: int
    tokenizer: Any

    def generate(
        self, request_id: str, prompt: str | list[int], params: SamplingParams
    ) -> AsyncIterator[Any]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def abort(self, request_id: str) -> None: ...

    async def wait_dead(self) -> BaseException | None:
        """Return once the engine has died by itself (its failure, or None if it does not say)."""
        ...

    def stats(self) -> dict[str, Any]: ...


@dataclass
class Prepared:
    kind: str  # "chat" or "completion"
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    created: int
    logprobs: bool = False  # the answer reports token log-probabilities
    # when the request was taken up (perf_counter), before its tokenization: TTFT and end-to-end
    # latency count from here, the wait a client sees (a long prompt's tokenizing included)
    arrival: float = field(default_factory=time.perf_counter)


class Generation:
    """One admitted engine request: iterate its outputs; ``close`` aborts it if unfinished."""

    def __init__(self, engine: Engine, prepared: Prepared, timer: RequestTimer,
                 energy: Any = None) -> None:
        self.engine = engine
        self.request_id = prepared.request_id
        self.timer = timer
        self._energy = energy  # cloud_server.energy.EnergyAccounting, or None
        # generate() validates at the call (429, 400): a refused request takes no energy share
        self._iter = engine.generate(prepared.request_id, prepared.prompt_ids, prepared.params)
        self._energy_key = energy.start() if energy is not None else None
        self._first: Any = None
        self.finished = False
        self.failed = False  # the engine ended it with an error (not the client, not a shutdown)
        self.last: Any = None

    async def admit(self) -> None:
        """Pull the first output; admission errors (queue full, context length) raise here."""
        try:
            self._first = await self._iter.__anext__()
        except StopAsyncIteration:
            self._first = None
        except BaseException as exc:
            # a refusal (queue full, a prompt too long) that comes with the first output, as a
            # cluster replica's does, is counted as rejected only, as the single server's refusal
            # at generate(): not also as a request finished with an error
            self.finished = isinstance(exc, QueueFullError | InvalidRequestError)
            self.failed = isinstance(exc, Exception)
            await self.close()
            raise

    async def outputs(self) -> AsyncIterator[Any]:
        pending = [self._first] if self._first is not None else []
        self._first = None
        while True:
            if pending:
                out = pending.pop()
            else:
                try:
                    out = await self._iter.__anext__()
                except StopAsyncIteration:
                    # ended without its finishing output (a replica cut off): a half answer is
                    # an error, not a 200 with "stop" (close() counts it as failed)
                    self.failed = True
                    raise EngineError("the engine ended the request before it finished") from None
                except Exception:
                    self.failed = True
                    raise
            self.last = out
            self.timer.on_tokens(len(out.delta_token_ids), out.num_prompt_tokens)
            if out.finished:
                self.finished = True
                self.timer.on_finish(out.finish_reason)
                if self._energy is not None:  # sets out.energy (usage.energy)
                    self._energy.finish(self._energy_key, out)
                    self._energy_key = None
                if out.finish_reason not in _ANSWER_ENDS:
                    self.failed = True
                    raise EngineError(f"the engine ended the request ({out.finish_reason})")
            yield out
            if out.finished:
                return

    async def close(self) -> None:
        if self._energy is not None and self._energy_key is not None:
            self._energy.cancel(self._energy_key)
            self._energy_key = None
        with contextlib.suppress(Exception):
            aclose = getattr(self._iter, "aclose", None)
            if aclose is not None:
                await aclose()
        if not self.finished:
            self.finished = True
            # the engine's own word for a request that failed: /metrics keeps failures apart from
            # the aborts of clients that hung up
            self.timer.on_finish("error" if self.failed else "abort")
            with contextlib.suppress(Exception):
                await self.engine.abort(self.request_id)


class _ClosingEvents:
    """Async iterator over ``events`` whose ``aclose`` also closes ``generation``. An async
    generator closed before its first step skips its ``finally``: a client gone before the
    headers went out (EventStreamResponse then closes the events unstarted) left the engine
    request running, its energy share open and no finish recorded."""

    def __init__(self, events: AsyncIterator[str], generation: Generation) -> None:
        self._events = events
        self._generation = generation

    def __aiter__(self) -> _ClosingEvents:
        return self

    async def __anext__(self) -> str:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        try:
            await self._events.aclose()  # type: ignore[attr-defined]
        finally:
            await self._generation.close()  # a second close does nothing


def usage_of(out: Any) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": out.num_prompt_tokens,
        "completion_tokens": out.num_output_tokens,
        "total_tokens": out.num_prompt_tokens + out.num_output_tokens,
    }
    cached = getattr(out, "num_cached_tokens", None)
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    energy = getattr(out, "energy", None)  # joules, joules_per_output_token, source
    if energy:
        usage["energy"] = energy
    return usage


class OpenAIServing:
    def __init__(self, engine: Engine, model_name: str, metrics: ServerMetrics, *,
                 system_prompt: str | None = None) -> None:
        self.engine = engine
        self.model_name = model_name
        self.metrics = metrics
        self.system_prompt = system_prompt

    # -- request preparation -------------------------------------------------------------------

    def prepare(self, req: ChatCompletionRequest | CompletionRequest) -> Prepared:
        """Tokenize and check ``req`` (CPU work: the server runs this in a worker thread)."""
        arrival = time.perf_counter()
        tokenizer = self.engine.tokenizer
        if isinstance(req, ChatCompletionRequest):
            kind, prefix = "chat", "chatcmpl"
            messages = req.chat_messages()
            if self.system_prompt and not any(m["role"] == "system" for m in messages):
                messages = [{"role": "system", "content": self.system_prompt}, *messages]
            # a message's text is plain text: only the template's markers become control tokens
            # (cloud_server.models.tokenizer)
            prompt_ids = list(tokenizer.encode_chat(messages))
            # a base model's transcript must not run on into the user's next turn: the prompt
            # format's own stops (the device adds the same ones, hybridllm.prompts)
            format_stops = list(tokenizer.stop_strings(messages))
        else:
            kind, prefix = "completion", "cmpl"
            format_stops = []
            prompt = req.single_prompt()
            prompt_ids = list(tokenizer.encode(prompt)) if isinstance(prompt, str) else list(prompt)
        if not prompt_ids:
            raise InvalidRequestError("The prompt is empty after tokenization.", param="prompt")
        max_len = int(self.engine.max_model_len)
        limit = req.output_limit()
        param = req.limit_param()
        if len(prompt_ids) >= max_len:
            # the prompt alone too long: no max_tokens would help, so name the prompt (and not as
            # "requested 64 tokens (64 in the prompt, 0 for the completion)" of a 64-token window)
            what = "messages" if kind == "chat" else "prompt"
            raise ContextLengthError(
                f"This model's maximum context length is {max_len} tokens. However, your {what} "
                f"resulted in {len(prompt_ids)} tokens, which leaves no room for the completion. "
                f"Please reduce the length of the {what}.",
                param=what,
            )
        if limit is not None and len(prompt_ids) + limit > max_len:
            raise ContextLengthError(
                f"This model's maximum context length is {max_len} tokens. However, you "
                f"requested {len(prompt_ids) + limit} tokens ({len(prompt_ids)} in the "
                f"prompt, {limit} for the completion). Please reduce the prompt or the "
                f"completion length.",
                param=param,
            )
        params = SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=-1 if req.top_k is None else req.top_k,
            max_tokens=limit if limit is not None else max_len - len(prompt_ids),
            stop=list(dict.fromkeys(req.stop_list() + format_stops)),
            stop_token_ids=list(req.stop_token_ids or []),
            seed=req.seed,
            ignore_eos=req.ignore_eos,
            speculative_method=req.speculative_method,
            num_speculative_tokens=req.num_speculative_tokens,
            # the shared models (the proxy's) have no num_logprobs: they refuse logprobs
            logprobs=getattr(req, "num_logprobs", lambda: None)(),
            **_extra_sampling(req),
        )
        return Prepared(
            kind=kind,
            request_id=f"{prefix}-{uuid.uuid4().hex}",
            prompt_ids=prompt_ids,
            params=params,
            stream=req.stream,
            include_usage=req.include_usage(),
            created=int(time.time()),
            logprobs=params.logprobs is not None,
            arrival=arrival,
        )

    async def admit(self, prepared: Prepared) -> Generation:
        generation = Generation(self.engine, prepared, self.metrics.request_timer(prepared.arrival),
                                energy=self.metrics.energy)
        await generation.admit()
        return generation

    # -- responses -----------------------------------------------------------------------------

    async def full_response(self, prepared: Prepared, generation: Generation) -> dict[str, Any]:
        parts: list[str] = []
        entries: list[Any] = []
        try:
            async for out in generation.outputs():
                parts.append(out.delta_text)
                entries += getattr(out, "logprobs", None) or []
        finally:
            await generation.close()
        last = generation.last
        if last is None:
            raise ServerError("the engine returned no output")
        build = chat_completion if prepared.kind == "chat" else text_completion
        return build(
            id=prepared.request_id,
            created=prepared.created,
            model=self.model_name,
            text="".join(parts),
            finish_reason=last.finish_reason or "stop",
            usage=usage_of(last),
            logprobs=self._logprobs(prepared, entries),
        )

    def stream_events(self, prepared: Prepared, generation: Generation) -> AsyncIterator[str]:
        """The SSE events of ``generation``; closing them ends it, even if none was ever sent."""
        return _ClosingEvents(self._events(prepared, generation), generation)

    async def _events(self, prepared: Prepared, generation: Generation) -> AsyncIterator[str]:
        chat = prepared.kind == "chat"
        writer = ChunkWriter(id=prepared.request_id, created=prepared.created, model=self.model_name,
                             chat=chat, include_usage=prepared.include_usage)
        try:
            if chat:
                yield writer.role()
            async for out in generation.outputs():
                entries = getattr(out, "logprobs", None) or []
                if out.delta_text or entries:  # each chunk carries the entries of its tokens
                    yield writer.text(out.delta_text, self._logprobs(prepared, entries))
                if out.finished:
                    yield writer.finish(out.finish_reason or "stop")
            if prepared.include_usage and generation.last is not None:
                yield writer.usage(usage_of(generation.last))
            yield DONE
        except Exception as exc:
            # Headers are gone already: report in-band, as OpenAI does, then end the stream. A
            # request error or a named server state (a code: engine_dead, server_shutting_down)
            # says what was wrong; anything else is not the client's business.
            kind = error_kind(exc)
            if kind.status < 500 or kind.code is not None:
                message, param = str(exc), getattr(exc, "param", None)
            else:
                logger.error("stream %s failed: %s", prepared.request_id, type(exc).__name__)
                message, param = "The server had an error while streaming.", None
            yield error_event(error_body(message, kind, param=param))
        finally:
            await generation.close()

    def _logprobs(self, prepared: Prepared, entries: list[Any]) -> dict[str, Any] | None:
        if not prepared.logprobs:
            return None
        tokenizer = self.engine.tokenizer
        if prepared.kind == "chat":
            return chat_logprobs(entries, tokenizer.decode, getattr(tokenizer, "token_bytes", None))
        return text_logprobs(entries, tokenizer.decode, getattr(tokenizer, "token_bytes", None))


# A logprob of -inf (a token the model rules out) is no JSON number: OpenAI's floor instead.
_FLOOR = -9999.0


def _logprob(value: float) -> float | None:
    """A log-probability as JSON can carry it: -inf floored (above); NaN or +inf (logits that
    overflowed) is no figure at all, sent as null as vLLM's responses do. Before, a NaN made the
    whole answer a 500 (its text lost) and put a bare ``NaN`` in a stream's chunk."""
    if math.isnan(value) or value == math.inf:
        return None
    return max(value, _FLOOR)


def _token(decode: Any, token_id: int, token_bytes: Any = None) -> str:
    """The token's text: its own bytes' where the tokenizer gives them (a SentencePiece token
    "▁a" decoded alone loses its space, its bytes keep it), so ``token`` reads as ``bytes``."""
    if token_bytes is not None:
        return token_bytes(token_id).decode("utf-8", errors="replace")
    return decode([token_id])


def chat_logprobs(entries: list[Any], decode: Any, token_bytes: Any = None) -> dict[str, Any]:
    """OpenAI's chat shape: ``{"content": [{token, logprob, bytes, top_logprobs}]}``. ``bytes`` are
    the token's own (``token_bytes``): a token that is only part of a character has its text
    U+FFFD but its real bytes, so the entries' bytes joined are the answer's UTF-8."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        if token_bytes is None:
            text = _token(decode, token_id)
            raw = text.encode("utf-8")
        else:  # one call: the text is the bytes' (_token)
            raw = token_bytes(token_id)
            text = raw.decode("utf-8", errors="replace")
        return {"token": text, "logprob": _logprob(logprob), "bytes": list(raw)}

    return {"content": [
        {**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]} for e in entries
    ]}


def text_logprobs(entries: list[Any], decode: Any, token_bytes: Any = None) -> dict[str, Any]:
    """The legacy shape: parallel lists; each ``top_logprobs`` dict holds the N most likely
    tokens and the emitted one (so up to N + 1 entries, as OpenAI's); offsets into ``text``.
    This shape has no ``bytes``: a token that is only part of a character is named by its bytes,
    as OpenAI does (``bytes:\\xe6\\x97``), so such tokens neither read as U+FFFD nor share one
    key in a ``top_logprobs`` dict (which kept one of them and lost the others)."""

    def name(token_id: int) -> str:
        text = _token(decode, token_id, token_bytes)
        if "\ufffd" in text and token_bytes is not None:
            raw = token_bytes(token_id)
            if raw != text.encode("utf-8"):
                return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        return text

    tops = []
    for e in entries:
        top = {name(t): _logprob(lp) for t, lp in e.top}
        top.setdefault(name(e.token_id), _logprob(e.logprob))
        tops.append(top)
    return {
        "tokens": [name(e.token_id) for e in entries],
        "token_logprobs": [_logprob(e.logprob) for e in entries],
        "top_logprobs": tops,
        "text_offset": [e.text_offset for e in entries],
    }


def unsupported_sampling() -> dict[str, float]:
    """vLLM sampling fields this engine lacks, with the one (neutral) value accepted for each."""
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    return {name: v for name, v in (("min_p", 0.0), ("repetition_penalty", 1.0)) if name not in known}


def _extra_sampling(req: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    """vLLM's ``min_p`` and ``repetition_penalty``: passed on when the engine has them, else
    accepted only at their neutral value (0 and 1)."""
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    out: dict[str, Any] = {}
    for name, neutral in (("min_p", 0.0), ("repetition_penalty", 1.0)):
        value = getattr(req, name)
        if value is None or value == neutral:
            continue
        if name not in known:
            raise InvalidRequestError(f"{name} is not supported by this server.", param=name)
        out[name] = value
    return out
