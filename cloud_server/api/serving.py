"""Turn validated OpenAI requests into engine requests, and engine outputs into OpenAI responses.

A request is tokenized here (the chat template rendered by the engine's tokenizer), checked
against the context window, and admitted by pulling its first output before anything is sent:
that way a full queue or an over-long prompt is still an HTTP error with a status, not a broken
stream. Every exit path (finish, error, client gone) closes the engine iterator and aborts the
request if it had not finished, so its KV blocks go back to the pool.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from cloud_server.energy import energy_report, joules_of
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import ContextLengthError, InvalidRequestError, ServerError
from hybridllm._message_text import valid_text
from hybridllm.wire.responses import (
    DONE,
    ChunkWriter,
    chat_choice,
    chat_completion,
    error_event,
    text_choice,
    text_completion,
)

from .errors import error_body, error_kind
from .generation import Choices, Engine, Prepared, _ClosingEvents
from .logprobs import _textless, chat_logprobs, text_logprobs
from .metrics import RequestTimer, ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest

logger = logging.getLogger("cloud_server.api")


def usage_of(out: Any, *more: Any) -> dict[str, Any]:
    """The usage of a response from its choices' last outputs: the prompt (and its cached tokens,
    choice 0's lookup) counted once, the completion tokens and the energy summed over choices."""
    outs = (out, *more)
    completion = sum(o.num_output_tokens for o in outs)
    usage: dict[str, Any] = {
        "prompt_tokens": out.num_prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": out.num_prompt_tokens + completion,
    }
    cached = getattr(out, "num_cached_tokens", None)
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    # one choice too: a replica's report of NaN or negative joules is no figure (a non-streamed
    # answer carrying it failed with a 500, JSON has no NaN; a stream carried null joules)
    energy = _energy_of(outs, completion)
    if energy:  # joules, joules_per_output_token, source
        usage["energy"] = energy
    return usage


def _energy_of(outs: tuple[Any, ...], num_output_tokens: int) -> dict[str, Any] | None:
    """The request's energy: the sum of its choices' (each its share of what the source measured
    while it ran); none unless every choice has a figure."""
    reports = [getattr(o, "energy", None) for o in outs]
    # the rule /metrics records a replica's report by (EnergyAccounting.finish)
    joules = [joules_of(r.get("joules")) if isinstance(r, dict) else None for r in reports]
    if any(j is None for j in joules):
        return None
    sources = sorted({str(r.get("source") or "unknown") for r in reports if isinstance(r, dict)})
    return energy_report(sum(j for j in joules if j is not None), num_output_tokens, "+".join(sources))


class OpenAIServing:
    def __init__(self, engine: Engine, model_name: str, metrics: ServerMetrics, *,
                 system_prompt: str | None = None) -> None:
        self.engine = engine
        self.model_name = model_name
        self.metrics = metrics
        self.system_prompt = system_prompt
        self._markers: dict[int, str] | None = None  # _marker_names

    # -- request preparation -------------------------------------------------------------------

    def prepare(self, req: ChatCompletionRequest | CompletionRequest) -> Prepared:
        """Tokenize and check ``req`` (CPU work: the server runs this in a worker thread)."""
        arrival = time.perf_counter()
        _check_n_fits(req.n, getattr(self.engine, "config", None))
        tokenizer = self.engine.tokenizer
        if isinstance(req, ChatCompletionRequest):
            kind, prefix = "chat", "chatcmpl"
            tools = _tools_for(req, tokenizer)
            prompt_ids, format_stops = self.chat_prompt(req)
        else:
            kind, prefix = "completion", "cmpl"
            format_stops, tools = [], None
            prompt = req.single_prompt()
            prompt_ids = list(tokenizer.encode(prompt)) if isinstance(prompt, str) else list(prompt)
            if not isinstance(prompt, str):  # "prompt": [[ids]] is a batch of one
                where = "prompt[0]" if prompt is not req.prompt else "prompt"
                _check_prompt_ids(prompt_ids, _vocab_size(tokenizer), where)
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
            # the Grammar its response_format was parsed to (None: plain text)
            response_format=getattr(req, "response_grammar", lambda: None)(),
            **_extra_sampling(req, _vocab_size(tokenizer)),
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
            n=req.n,
            tools=tools,
        )

    def chat_prompt(self, req: ChatCompletionRequest, *, add_generation_prompt: bool = True
                    ) -> tuple[list[int], list[str]]:
        """A chat request's prompt ids and its prompt format's stop strings (the default system
        prompt first where the conversation has none; its tools, if any, for the template)."""
        tokenizer = self.engine.tokenizer
        messages = req.chat_messages()
        if self.system_prompt and not any(m["role"] == "system" for m in messages):
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        plan = getattr(req, "tool_plan", lambda: None)()
        # a message's text is plain text: only the template's markers become control tokens
        # (cloud_server.models.tokenizer)
        prompt_ids = list(tokenizer.encode_chat(messages, add_generation_prompt=add_generation_prompt,
                                                tools=plan.tools if plan is not None else None))
        # a base model's transcript must not run on into the user's next turn: the prompt
        # format's own stops (the device adds the same ones, hybridllm.prompts)
        return prompt_ids, list(tokenizer.stop_strings(messages))

    def tokenize(self, req: TokenizeRequest) -> dict[str, Any]:
        """vLLM's ``/tokenize`` answer (CPU work: run in a worker thread)."""
        tokenizer = self.engine.tokenizer
        if req.messages is not None:
            chat = req.chat_request(self.model_name)
            ids, _ = self.chat_prompt(chat, add_generation_prompt=req.add_generation_prompt)
        elif not req.prompt:
            ids = []  # as vLLM answers an empty prompt
        else:  # as /v1/completions reads it (its BOS too, unless add_special_tokens is false)
            ids = list(tokenizer.encode(req.prompt) if req.add_special_tokens
                       else tokenizer.encode(req.prompt, add_special=False))
        # a control token decodes to nothing: named as logprobs name it (<|im_start|>, not "")
        names = self._marker_names() if req.return_token_strs else {}
        strs = ([valid_text(tokenizer.decode([i])) or _textless(i, names) for i in ids]
                if req.return_token_strs else None)
        return {"count": len(ids), "max_model_len": int(self.engine.max_model_len), "tokens": ids,
                "token_strs": strs}

    def detokenize(self, req: DetokenizeRequest) -> dict[str, Any]:
        """vLLM's ``/detokenize`` answer: the text of the ids (an id outside the vocabulary a 400),
        control tokens written by name (``<|im_start|>``), as vLLM writes them: decoded alone they
        are no text, and a templated prompt came back without its turn markers."""
        tokenizer = self.engine.tokenizer
        ids = list(req.tokens)
        _check_prompt_ids(ids, _vocab_size(tokenizer), "tokens")
        names = self._marker_names()
        parts: list[str] = []
        run: list[int] = []
        for token in [*ids, None]:  # runs of ordinary ids decoded whole (a character may span ids)
            if token is not None and token not in names:
                run.append(token)
                continue
            if run:
                parts.append(tokenizer.decode(run))
                run = []
            if token is not None:
                parts.append(names[token])
        # a decoder that writes half a surrogate pair must not fail the answer's UTF-8
        return {"prompt": valid_text("".join(parts))}

    async def admit(self, prepared: Prepared) -> Choices:
        def timer() -> RequestTimer:  # one per choice: each is an engine request in /metrics
            return self.metrics.request_timer(prepared.arrival)

        return await Choices.admit(self.engine, prepared, timer, energy=self.metrics.energy)

    # -- responses -----------------------------------------------------------------------------

    async def full_response(self, prepared: Prepared, choices: Choices) -> dict[str, Any]:
        """The whole answer, every choice; an error of one is the request's (no half answer)."""
        n = len(choices.generations)
        parts: list[list[str]] = [[] for _ in range(n)]
        entries: list[list[Any]] = [[] for _ in range(n)]
        try:
            async for i, out in choices.outputs():
                parts[i].append(out.delta_text)
                entries[i] += getattr(out, "logprobs", None) or []
        finally:
            await choices.close()
        lasts = choices.lasts
        if any(last is None for last in lasts):
            raise ServerError("the engine returned no output")
        chat = prepared.kind == "chat"
        if chat and prepared.tools is not None:
            return self._tool_response(prepared, parts, lasts)
        build, choice = (chat_completion, chat_choice) if chat else (text_completion, text_choice)
        body = build(
            id=prepared.request_id,
            created=prepared.created,
            model=self.model_name,
            text="".join(parts[0]),
            finish_reason=lasts[0].finish_reason or "stop",
            usage=usage_of(*lasts),
            logprobs=self._logprobs(prepared, entries[0]),
        )
        body["choices"] += [choice("".join(parts[i]), lasts[i].finish_reason or "stop",
                                   self._logprobs(prepared, entries[i]), index=i) for i in range(1, n)]
        return body

    def _tool_response(self, prepared: Prepared, parts: list[list[str]], lasts: list[Any]) -> dict[str, Any]:
        """A chat answer whose choices are read for tool calls (as a stream reads them)."""
        body = chat_completion(id=prepared.request_id, created=prepared.created, model=self.model_name,
                               text="", finish_reason="stop", usage=usage_of(*lasts))
        body["choices"] = []
        for i, (texts, last) in enumerate(zip(parts, lasts, strict=True)):
            reader = prepared.tools.reader()
            reader.feed("".join(texts))
            _, calls, reason = reader.finish(last.finish_reason or "stop")
            body["choices"].append(chat_choice(reader.content(), reason, index=i, tool_calls=calls))
        return body

    def stream_events(self, prepared: Prepared, choices: Choices) -> AsyncIterator[str]:
        """The SSE events of ``choices``; closing them ends it, even if none was ever sent."""
        return _ClosingEvents(self._events(prepared, choices), choices)

    async def _events(self, prepared: Prepared, choices: Choices) -> AsyncIterator[str]:
        """Each choice's chunks carry its index; they interleave as the choices produce them."""
        chat = prepared.kind == "chat"
        writer = ChunkWriter(id=prepared.request_id, created=prepared.created, model=self.model_name,
                             chat=chat, include_usage=prepared.include_usage)
        # each choice's answer read for tool calls: its text until a call begins, the calls at its end
        readers = ([prepared.tools.reader() for _ in choices.generations]
                   if chat and prepared.tools is not None else None)
        try:
            if chat:
                for i in range(len(choices.generations)):
                    yield writer.role(index=i)
            async for i, out in choices.outputs():
                entries = getattr(out, "logprobs", None) or []
                text = readers[i].feed(out.delta_text) if readers else out.delta_text
                if text or entries:  # each chunk carries the entries of its tokens
                    yield writer.text(text, self._logprobs(prepared, entries), index=i)
                for delta in readers[i].take_deltas() if readers else ():
                    yield writer.tool_call(delta, index=i)  # a forced call's start, its arguments
                if out.finished:
                    reason = out.finish_reason or "stop"
                    if readers:
                        rest, calls, reason = readers[i].finish(reason)
                        if rest:
                            yield writer.text(rest, index=i)
                        for position, call in enumerate(calls[readers[i].streamed:], readers[i].streamed):
                            yield writer.tool_call({"index": position, **call}, index=i)
                    yield writer.finish(reason, index=i)
            lasts = choices.lasts
            if prepared.include_usage and all(last is not None for last in lasts):
                yield writer.usage(usage_of(*lasts))
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
            await choices.close()

    def _logprobs(self, prepared: Prepared, entries: list[Any]) -> dict[str, Any] | None:
        if not prepared.logprobs:
            return None
        tokenizer = self.engine.tokenizer
        shape = chat_logprobs if prepared.kind == "chat" else text_logprobs
        return shape(entries, tokenizer.decode, getattr(tokenizer, "token_bytes", None),
                     names=self._marker_names())

    def _marker_names(self) -> dict[int, str]:
        """The tokenizer's control tokens by id (``<|im_end|>``), to name them in logprobs; read
        once (a tokenizer without ``marker_bytes``, as the tests' fakes: none)."""
        if self._markers is None:
            read = getattr(self.engine.tokenizer, "marker_bytes", None)
            try:
                markers = read() if callable(read) else {}
            except NotImplementedError:
                markers = {}
            self._markers = {i: raw.decode("utf-8", errors="replace") for i, raw in markers.items()}
        return self._markers


def _check_n_fits(n: int, config: Any) -> None:
    """A 400 for ``n`` choices more than the engine can hold at once (``config``: its EngineConfig;
    None, as a cluster's engine, checks nothing). Each choice is a request of its own, and an idle
    engine takes ``max_num_seqs`` into its batch and ``max_waiting`` more into its queue: past that
    the request can never be admitted, yet it was a 429 with Retry-After 1, which clients (the
    openai one among them) retried in vain before failing with a rate-limit error."""
    seqs, waiting = getattr(config, "max_num_seqs", None), getattr(config, "max_waiting", None)
    if not (isinstance(seqs, int) and isinstance(waiting, int)) or n <= seqs + waiting:
        return
    raise InvalidRequestError(
        f"Invalid value for 'n': {n} choices are more than this server can hold at once ({seqs} "
        f"running and {waiting} waiting, its --max-num-seqs and --max-waiting); send n <= "
        f"{seqs + waiting}, or the choices as several requests.", param="n")


def _check_prompt_ids(ids: list[int], vocab_size: int | None, where: str = "prompt") -> None:
    """A token-id prompt's ids are the tokenizer's (as ``logit_bias``'s and ``/detokenize``'s): a
    400 naming the first one past it and the range. The engine's own refusal said only "prompt
    token ids out of the vocabulary", naming neither the id nor where it was."""
    if vocab_size is None:
        return
    for i, token in enumerate(ids):
        if token >= vocab_size:
            raise InvalidRequestError(f"Invalid '{where}[{i}]': {token} is not a token id of this model (its "
                                      f"vocabulary is 0..{vocab_size - 1}).", param=f"{where}[{i}]")


def _tools_for(req: Any, tokenizer: Any) -> Any:
    """The request's ToolPlan (None without tools); "auto" needs a chat template that describes
    tools to the model (a 400 otherwise: a forced call is constrained by its grammar alone)."""
    plan = getattr(req, "tool_plan", lambda: None)()
    if plan is None or plan.mode != "auto":
        return plan
    fmt = getattr(tokenizer, "prompt_format", None)
    if fmt is not None and not fmt().renders_tools():
        raise InvalidRequestError(
            "This model's chat template does not describe tools to the model, so it cannot choose "
            "to call one: send tool_choice 'required' or name a function (the answer is then "
            "constrained to a call of it), or use a model whose template takes tools.", param="tool_choice")
    return plan


# vLLM's and OpenAI's sampling controls, with the value that turns each off
_CONTROLS = (("min_p", 0.0), ("repetition_penalty", 1.0), ("presence_penalty", 0.0),
             ("frequency_penalty", 0.0))


def _extra_sampling(req: ChatCompletionRequest | CompletionRequest, vocab_size: int | None = None
                    ) -> dict[str, Any]:
    """``min_p``, ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty`` and
    ``logit_bias``, for SamplingParams (those at their neutral value left out); a biased token id
    must be in the vocabulary (``vocab_size``: the tokenizer's), checked here so the request is a
    400, not a failure at its first token."""
    out: dict[str, Any] = {}
    for name, neutral in _CONTROLS:
        value = getattr(req, name, None)
        if value is None or value == neutral:
            continue
        out[name] = value
    bias = getattr(req, "logit_bias", None)
    if bias:
        ids: dict[int, float] = {}
        for key, value in bias.items():
            token = int(key) if key.isascii() and key.isdigit() else -1
            if token < 0 or (vocab_size is not None and token >= vocab_size):
                where = f" (this model's vocabulary is 0..{vocab_size - 1})" if vocab_size else ""
                raise InvalidRequestError(f"Invalid key in 'logit_bias': {key[:40]!r} is not a token id"
                                          f"{where}.", param="logit_bias")
            ids[token] = value
        if any(ids.values()):  # all zeros change nothing: the engine is not asked
            out["logit_bias"] = ids
    return out


def _vocab_size(tokenizer: Any) -> int | None:
    size = getattr(tokenizer, "vocab_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
