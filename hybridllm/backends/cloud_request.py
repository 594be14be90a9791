"""What goes to an endpoint: model discovery, the chat request body, the fields an endpoint refuses."""

from __future__ import annotations

import logging
import re
import time
from contextlib import AsyncExitStack
from typing import Any

from .._durations import duration
from .._exceptions import InvalidRequestError
from .._types import RAW_KINDS, GenerationParams, Messages
from .circuit import Endpoint
from .cloud_http import MAX_ERROR_BYTES, _Clients, _read_capped, _traced, _trickle_bound
from .cloud_status import _EndpointDown, _error_of, _Retryable, _StatusVerdicts
from .refusals import RefusalMemory, is_hosted

log = logging.getLogger("hybridllm.cloud")
MODELS_TIMEOUT_S = 10.0  # the longest wait for GET /v1/models (model discovery)
# fields a server may not know at all, left out for an endpoint that rejects them as unknown: the
# sampling fields outside OpenAI's API (vLLM's, our server's), and stream_options (newer than older
# servers and Azure API versions; without it the cloud sends no token count and the pipeline estimates)
OPTIONAL_FIELDS = ("top_k", "min_p", "repetition_penalty", "stream_options")
# fields of OpenAI's API that a model may refuse (its reasoning models): "Unsupported parameter:
# 'max_tokens' ... Use 'max_completion_tokens' instead", and "Unsupported value: 'temperature' does
# not support 0.7 with this model. Only the default (1) value is supported." (top_p alike)
# ("Unsupported parameter: 'stop' is not supported with this model": the client then cuts at the
# stop sequences itself)
MODEL_FIELDS = ("max_tokens", "temperature", "top_p", "stop")
QUOTED_ONLY = {"stop"}  # a common word: without a param, the message must name it in quotes
RENAMED = {"max_tokens": "max_completion_tokens"}  # a refused field that goes on under its new name
# what the request loses, for the warning, by the field it no longer sends
LOSES = {"stream_options": "the cloud reports no token count, so each answer's tokens are estimated "
                           "(the prompt plus about 4 characters a token)",
         "max_tokens": "the answer's length limit goes as max_completion_tokens",
         "temperature": "it samples at the server's default temperature, not the request's",
         "top_p": "it samples at the server's default top_p, not the request's",
         "stop": "the client cuts each answer at its stop sequences itself and closes the stream there "
                 "(the call is then counted from what the cloud sent, ~4 characters a token)"}
# how servers reject a field they do not know: OpenAI "Unrecognized request argument supplied: top_k",
# pydantic "Extra inputs are not permitted", Google "Unknown name", one lacking it "min_p is not supported"
UNKNOWN_WORDS = re.compile(r"unrecogni[sz]ed|unknown|unsupported|not supported|not permitted|not allowed"
                           r"|extra|unexpected|additional propert", re.IGNORECASE)
# how a model refuses a field of OpenAI's API (narrower: "not allowed" may be a bad value's wording)
UNSUPPORTED_WORDS = re.compile(r"unsupported|not supported|unrecogni[sz]ed|unknown", re.IGNORECASE)


_RECALLS_SAID: set[tuple[str, str, frozenset[str]]] = set()  # recalled refusals already warned of


class _Requests(_Clients, _StatusVerdicts):
    """The requests of :class:`~hybridllm.backends.cloud.CloudBackend` to one endpoint."""

    _model: str | None
    _auth: dict[str, tuple[str, str]]
    _query: dict[str, list[tuple[str, str]]]
    _refused: dict[tuple[str, str], frozenset[str]]
    _memory: RefusalMemory | None
    _remember_all: bool
    _recalled: set[tuple[str, str]]
    _found_models: dict[str, str]  # base URL -> the model its GET /models listed (set lazily)

    async def _resolve_model(self, ep: Endpoint) -> str:
        """The model to ask ``ep`` for: the configured one (cloud_model) for every endpoint, else
        the first its own GET /models lists, once per endpoint (before: the first endpoint's was
        sent to all, so one serving another model answered 404, or the wrong model answered)."""
        if self._model:
            return self._model
        if ep.base_url in self._found_models:
            return self._found_models[ep.base_url]
        import httpx

        # a cheap call: a server slow to answer it is not waited on for the whole read timeout, nor
        # one that trickles it a byte at a time (each byte would restart httpx's read timeout)
        limit = self.connect_timeout_s + min(self.read_timeout_s, MODELS_TIMEOUT_S)
        try:
            async with _trickle_bound(limit, f"could not list models at {ep.base_url}: no whole answer"):
                resp = await self._client().get(f"{ep.base_url}/models", timeout=httpx.Timeout(
                    min(self.read_timeout_s, MODELS_TIMEOUT_S), connect=self.connect_timeout_s),
                    auth=self._auth.get(ep.base_url, httpx.USE_CLIENT_DEFAULT),
                    params=self._query.get(ep.base_url))
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise self._unreachable(ep, exc) from exc
        except httpx.HTTPError as exc:
            raise _Retryable(f"could not list models at {ep.base_url}: "
                             f"{str(exc) or type(exc).__name__}") from exc
        if resp.status_code == 404:
            raise _EndpointDown(f"The cloud at {ep.base_url}/models answered HTTP 404: is cloud_url the "
                                "base URL of an OpenAI-compatible server? If it is, it does not list its "
                                "models: set cloud_model (HYBRIDLLM_CLOUD_MODEL).", status=404,
                                cause=f"HTTP 404 from {ep.base_url}/models")
        if resp.status_code != 200:
            self._raise_for_status(resp, listing=True)
        try:
            found = resp.json()["data"][0]["id"]
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise _Retryable(f"could not list models at {ep.base_url}: it lists no model "
                             f"({type(exc).__name__}: {resp.text[:80]!r})") from exc
        # a null or empty id was sent on as the model "None" or "" (the server then refused it, or
        # answered with a model of its choosing, under no name)
        if isinstance(found, bool) or not isinstance(found, str | int) or not str(found).strip():
            raise _Retryable(f"could not list models at {ep.base_url}: its first model has no name "
                             f"(id {found!r})")
        name = str(found)
        # (not kept in ``_model``: with endpoints serving different models, every answer was then
        # named after the last model found, not the one that wrote it)
        self._found_models[ep.base_url] = name
        return name

    def _model_at(self, ep: Endpoint) -> str | None:
        """The model ``ep`` is asked for (once known): the configured one, else the one it listed."""
        return self._model or self._found_models.get(ep.base_url)

    def request_body(self, model: str, messages: Messages, params: GenerationParams,
                     omit: frozenset[str] = frozenset()) -> dict:
        """The chat completion request. vLLM's sampling fields go only when they are not off (our
        server and vLLM take a missing one as off), and never the ``omit`` ones (fields this
        endpoint refused): left out, or sent under their new name (``RENAMED``)."""
        body: dict[str, Any] = {
            "model": model, "messages": messages, "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p,
        }
        if params.top_k > 0:  # 0 is off; the default (40) is sent, as the device samples with it
            body["top_k"] = params.top_k
        if params.min_p > 0:
            body["min_p"] = params.min_p
        if params.repeat_penalty != 1.0:
            body["repetition_penalty"] = params.repeat_penalty
        # OpenAI's own fields (hosted APIs take them): not optional, so a refusal stays an error
        if params.presence_penalty != 0.0:
            body["presence_penalty"] = params.presence_penalty
        if params.frequency_penalty != 0.0:
            body["frequency_penalty"] = params.frequency_penalty
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop)
        # structured output, OpenAI's field as the core normalized it: not optional either (a
        # server that ignored it would answer free text), so a refusal is the caller's error; a
        # regex or choice (no OpenAI form) goes as vLLM's structured_outputs, which our server takes
        fmt = params.response_format
        if fmt is not None and fmt.get("type") in RAW_KINDS:
            body["structured_outputs"] = {fmt["type"]: fmt[fmt["type"]]}
        elif fmt is not None:
            body["response_format"] = fmt
        # function calling: not optional either (a server that ignored tools would answer text)
        if params.tools is not None:
            body["tools"] = list(params.tools)
            if params.tool_choice is not None:
                body["tool_choice"] = params.tool_choice
            if params.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = params.parallel_tool_calls
        if any("tool_calls" in m for m in messages):  # a turn that only called tools: content null
            body["messages"] = [{**m, "content": m["content"] or None} if m.get("tool_calls") else m
                                for m in messages]
        for name in omit:
            value = body.pop(name, None)
            if name in RENAMED and value is not None:
                body[RENAMED[name]] = value
        return body

    async def _post(self, ep: Endpoint, model: str, messages: Messages, params: GenerationParams,
                    stack: AsyncExitStack) -> tuple[Any, dict]:
        """POST the request and return the answer once it is 200 (else raise what it means), with
        the body that went (what it left out tells the stream what to do itself). A 400 or 422
        that refuses fields we can do without (``_refused_fields``) is sent again at once without
        them, and they are not sent to this endpoint for this model from then on. Each round must
        refuse a field not refused before, and there are few, so this ends."""
        import httpx

        key = (ep.base_url, model)
        self._recall(key)
        while True:
            refused = self._refused.get(key, frozenset())
            body = self.request_body(model, messages, params, refused)
            # httpx's read timeout bounds each read, not the whole answer: a server that trickles its
            # headers (or an error's body) a byte at a time would be waited on for ever. The bound
            # is what the per-step timeouts allow a server that does not trickle: a wait for a free
            # pooled connection (httpx's pool timeout is the read timeout), the connect, the head
            limit = self.connect_timeout_s + 2 * self.read_timeout_s
            async with _trickle_bound(limit, f"timeout talking to {ep.base_url}: no whole answer's head"):
                resp = await stack.enter_async_context(
                    self._client().stream("POST", f"{ep.base_url}/chat/completions", json=body,
                                          auth=self._auth.get(ep.base_url, httpx.USE_CLIENT_DEFAULT),
                                          params=self._query.get(ep.base_url), headers=_traced()))
                if resp.status_code == 200:
                    return resp, body
                resp, _ = await _read_capped(resp, MAX_ERROR_BYTES)
            new = _refused_fields(resp, body) - refused
            if not new:
                _raise_if_format_refused(resp, body, ep.base_url, model)
                self._raise_for_status(resp, ep.base_url)
            learned = new - self._refused.get(key, frozenset())  # another request may have learned it
            self._refused[key] = self._refused.get(key, frozenset()) | new
            if learned and self._memory is not None and self._remembers(ep.base_url):
                self._memory.remember(ep.base_url, model, self._refused[key])
            if learned:
                sent = ", ".join(f"{n} {body[n]}" if n in ("temperature", "top_p") else n
                                 for n in sorted(learned))
                loses = "; ".join(dict.fromkeys(LOSES.get(n, "it samples without that filter")
                                                for n in sorted(learned)))
                log.warning("The cloud at %s (model %s) does not accept %s (HTTP %d: %s); it is sent "
                            "requests without %s from now on: %s", ep.base_url, model, sent,
                            resp.status_code, _error_of(resp)[0][:160],
                            "them" if len(learned) > 1 else "it", loses)

    def _remembers(self, base_url: str) -> bool:
        return self._remember_all or is_hosted(base_url)

    def _recall(self, key: tuple[str, str]) -> None:
        """Once per endpoint and model: take up what an earlier process learned it refuses, so
        this one's first request does not pay a refused round trip per field again."""
        if key in self._recalled or self._memory is None or not self._remembers(key[0]):
            return
        self._recalled.add(key)
        found = self._memory.recall(*key)
        if found is None:
            return
        fields, at = found
        new = fields - self._refused.get(key, frozenset())
        if not new:
            return
        self._refused[key] = self._refused.get(key, frozenset()) | new
        said = (*key, new)  # once per process: each HybridLLM made in it recalls the file again
        if said in _RECALLS_SAID:
            return
        _RECALLS_SAID.add(said)
        loses = "; ".join(dict.fromkeys(LOSES.get(n, "it samples without that filter") for n in sorted(new)))
        log.warning("The cloud at %s (model %s) refused %s when asked %s ago (kept in %s; delete it to "
                    "forget); it is sent requests without %s: %s", key[0], key[1], ", ".join(sorted(new)),
                    duration(time.time() - at), self._memory.path, "them" if len(new) > 1 else "it", loses)


def _message_and_param(resp: Any) -> tuple[str, str]:
    """An error answer's message and the ``param`` it names ("" when none)."""
    message, _ = _error_of(resp)
    try:
        error = resp.json().get("error")
        param = str(error.get("param") or "") if isinstance(error, dict) else ""
    except (ValueError, AttributeError):
        param = ""
    return message, param


def _raise_if_format_refused(resp: Any, body: dict, base_url: str, model: str) -> None:
    """A 400 or 422 that names ``response_format`` (its ``param``, or the message) when the body
    carried one: the endpoint or its model does not serve that structured output. Said so, with
    what to do, instead of the bare "the cloud rejected the request"."""
    field = next((f for f in ("response_format", "structured_outputs") if f in body), None)
    if field is None or resp.status_code not in (400, 422):
        return
    message, param = _message_and_param(resp)
    if field not in f"{param} {message} {resp.text[:2000]}":  # a 422 lists it in text
        return
    kind = body["response_format"].get("type", "?") if field == "response_format" else \
        next(iter(body[field]))
    served_by = " (hybridllm-cloud, vLLM)" if field == "structured_outputs" else ""
    raise InvalidRequestError(
        f"The cloud at {base_url} (model {model}) refused {field} {kind!r} (HTTP "
        f"{resp.status_code}{', param ' + param if param else ''}: {message}). It or its model does "
        "not serve this structured output: ask with route='edge' (the device model constrains its "
        f"own answer), point cloud_url at a server that serves it{served_by}, or leave {field} out.")


def _refused_fields(resp: Any, body: dict) -> frozenset[str]:
    """The fields of ``body`` that a 400 or 422 refuses and that the request can do without: an
    OPTIONAL_FIELDS one the server does not know (named anywhere in the answer: a 422 may list
    several), or a MODEL_FIELDS one the model does not take (named by the error's ``param`` or its
    message, as unsupported). Empty for any other refusal: a bad value of a field it takes ("Invalid
    value for 'temperature'") stays the caller's error."""
    if resp.status_code not in (400, 422):
        return frozenset()
    message, param = _message_and_param(resp)
    refused = set()
    text = f"{message} {param} {resp.text[:2000]}"
    if UNKNOWN_WORDS.search(text):
        refused |= {name for name in OPTIONAL_FIELDS if name in body and _names(text, name)}
    if UNSUPPORTED_WORDS.search(message):  # "Unsupported parameter", "Unsupported value"
        refused |= {name for name in MODEL_FIELDS
                    if name in body and (param == name or (not param and _names(message, name)
                                                           and (name not in QUOTED_ONLY
                                                                or _quoted(message, name))))}
    return frozenset(refused)


def _names(text: str, name: str) -> bool:
    """``text`` names the field ``name`` (a whole word: top_p is not top_k, nor max_tokens in
    max_completion_tokens)."""
    return re.search(rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])", text) is not None


def _quoted(text: str, name: str) -> bool:
    """``text`` names ``name`` in quotes ('stop', "stop", `stop`), as a field, not as a word."""
    return re.search(rf"['\"`]{name}['\"`]", text) is not None
