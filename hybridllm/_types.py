"""Plain data types shared by the client, the backends, the router and the cache."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from ._exceptions import InvalidRequestError
from ._private_repr import USER_TEXT, Message, Messages, private_repr
from ._response_format import RAW_KINDS, format_error, grammar_of, normalized_format
from .prompts import checked_text, text_of_content

ROLES = ("system", "user", "assistant", "developer", "tool")
MAX_STOP = 4  # stop strings a request may give, as OpenAI's API takes
# The longest model name: an answer repeats the request's name in every chunk (and a 404 quotes it),
# and a 3 MB name made a 300-token stream 774 MB. Names are ids or paths; this is far beyond any of
# them. The wire model (both servers) and the cloud client's reading of an answer's name share it.
MAX_MODEL_CHARS = 1024


def normalize_messages(messages: str | Sequence[Message], *, allow_empty: bool = False) -> Messages:
    """Turn a string or a list of OpenAI-style messages into a validated list of messages.

    A user turn without text and content that is an empty list of parts are refused, as
    ``chat("")`` is; ``allow_empty`` takes them (a labelled data file's conversations)."""
    if isinstance(messages, str):
        if not messages.strip():
            raise InvalidRequestError("The prompt is empty: pass a non-empty string or messages.")
        return [{"role": "user", "content": checked_text(messages, "The prompt")}]
    if not isinstance(messages, Sequence) or isinstance(messages, bytes):
        raise InvalidRequestError(
            "messages must be a string or a list of {'role': ..., 'content': ...} dicts."
        )
    if len(messages) == 0:
        raise InvalidRequestError(
            "The message list is empty: pass at least one {'role': 'user', 'content': ...}."
        )
    out: Messages = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise InvalidRequestError(f"messages[{i}] is not a dict with 'role' and 'content'.")
        role = msg.get("role")
        if role not in ROLES:
            raise InvalidRequestError(
                f"messages[{i}] has role {role!r}; use one of {', '.join(ROLES)}."
            )
        raw = msg.get("content")
        if raw is None and role == "assistant":
            # an assistant turn that only called tools has null content in OpenAI's format (what
            # openai's message.model_dump() gives back); the HTTP servers take it, so does this
            raw = ""
        if isinstance(raw, list) and not raw and not allow_empty:
            raise InvalidRequestError(f"messages[{i}]['content'] is an empty list of content parts: give "
                                      "at least one {'type': 'text', 'text': '...'}, or a string.")
        if isinstance(raw, list) and role == "assistant":  # OpenAI's refusal part is its text
            raw = [_refusal_as_text(p, f"messages[{i}]['content'][{j}]") for j, p in enumerate(raw)]
        content = text_of_content(raw, where=f"messages[{i}]['content']")
        if role == "assistant" and not content and msg.get("refusal") is not None:
            # a refused answer echoed back (openai's message.model_dump(): content null, the words
            # in "refusal"): the model sees what it said, as the HTTP servers read it
            content = _refusal_as_text({"type": "refusal", "refusal": msg["refusal"]},
                                       f"messages[{i}]")["text"]
        if role == "user" and not content.strip() and not allow_empty:  # as chat("") is refused
            raise InvalidRequestError(f"messages[{i}] is a user turn without text: write the question "
                                      "in its content, or leave the message out.")
        turn: Message = {"role": "system" if role == "developer" else role, "content": content}
        # function calling: an answer's calls and a tool's result keep what ties them together
        # (the cloud's template shows the model which call each result answers)
        if role == "assistant" and msg.get("tool_calls"):
            from ._tools import check_calls

            turn["tool_calls"] = check_calls(msg["tool_calls"], f"messages[{i}]['tool_calls']")
        if role == "tool" and msg.get("tool_call_id") is not None:
            if not isinstance(msg["tool_call_id"], str):
                raise InvalidRequestError(f"messages[{i}]['tool_call_id'] must be a string (the id of "
                                          "the call it answers).")
            turn["tool_call_id"] = msg["tool_call_id"]
        out.append(turn)
    if not any(m["role"] == "user" for m in out):
        raise InvalidRequestError("The messages hold no user turn: add {'role': 'user', ...}.")
    return out


def _refusal_as_text(part: Any, where: str) -> Any:
    """An OpenAI refusal (``{"type": "refusal", "refusal": "..."}``) as a text part; any other part
    as it is."""
    if not isinstance(part, dict) or part.get("type") != "refusal":
        return part
    words = part.get("refusal")
    if not isinstance(words, str):
        raise InvalidRequestError(f"{where}['refusal'] must be a string, got {type(words).__name__}.")
    return {"type": "text", "text": checked_text(words, f"{where}['refusal']")}


def estimate_text_tokens(text: str) -> int:
    """The tokens of ``text`` where no tokenizer is at hand, the one estimate the library uses (a
    prompt, an answer, a streamed piece): about 4 characters a token, rounded up, so that any
    non-empty text counts at least one token and "" counts none."""
    # BPE vocabularies average about 4 characters of English a token; ceil(n / 4) == -(-n // 4)
    return -(-len(text) // 4)


def estimate_tokens(messages: Sequence[Message]) -> int:
    """A prompt's tokens where no tokenizer is at hand: each message's text by
    :func:`estimate_text_tokens`, plus 4 for its place in the chat template (role and markers)."""
    return sum(estimate_text_tokens(str(m.get("content", ""))) + 4 for m in messages)


def last_user_text(messages: Messages) -> str:
    for msg in reversed(messages):
        if msg["role"] == "user":
            return str(msg["content"])
    return ""


@dataclass(frozen=True)
class GenerationParams:
    """Sampling settings of one request, validated on construction.

    ``top_k`` 0 and ``min_p`` 0 and ``repeat_penalty`` 1 turn those filters off, as do
    ``presence_penalty`` and ``frequency_penalty`` at 0 (OpenAI's, in [-2, 2]: a token's logit is
    lowered by ``presence_penalty`` once it is in the answer so far, and by ``frequency_penalty`` for
    each time it is; negative values favour repeats; sent to the cloud under their own names when
    not 0). The cloud is sent
    ``top_k``, ``min_p`` and ``repetition_penalty`` (vLLM's names) when they are not off (a missing
    one is off to our server and to vLLM; the default ``top_k`` 40 is sent), and an endpoint that
    rejects one as unknown (a hosted API: HTTP 400 "Unrecognized request argument supplied: top_k")
    is sent the request again without it, and never that field again (likewise ``max_tokens``, sent
    as ``max_completion_tokens``, and a ``temperature`` / ``top_p`` a hosted model takes only at its
    default: ``hybridllm.backends.cloud``, point 4).
    """

    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    seed: int | None = None
    # the caller's stop strings; in repr by their count and sizes only (user text)
    stop: tuple[str, ...] = field(default=(), metadata=USER_TEXT)
    logprobs: bool = False  # report the log-probability of each sampled token
    # OpenAI's penalties over the answer's own tokens (0 = off); last, so positional use stays as it was
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # structured output: OpenAI's response_format, kept normalized (the core's Grammar.response_format);
    # None for plain text. compare-only, not hashed: a dict has no hash
    response_format: dict[str, Any] | None = field(default=None, hash=False)
    # function calling (hybridllm._tools): OpenAI's tools, kept checked as a tuple; tool_choice
    # "none" / "auto" (the default with tools) / "required" / {"type": "function", "function":
    # {"name": ...}}; parallel_tool_calls False: at most one call. A model whose template lists
    # tools calls them: the cloud's, or the device's (Backend.calls_tools)
    tools: tuple[dict[str, Any], ...] | None = field(default=None, hash=False, metadata=USER_TEXT)
    tool_choice: str | dict[str, Any] | None = field(default=None, hash=False)
    parallel_tool_calls: bool | None = None
    # vLLM's structured_outputs ({"json": schema}, {"regex": pattern} or {"choice": [strings]}):
    # read into response_format (its grammar's own form) and None from then on
    structured_outputs: dict[str, Any] | None = field(default=None, hash=False, compare=False, repr=False)

    __repr__ = private_repr

    def __post_init__(self) -> None:
        # numbers of any type are taken (numpy's float32 and int64, as the config's arguments are)
        if not is_integer(self.max_tokens):
            raise InvalidRequestError(f"max_tokens must be an integer, got {self.max_tokens!r}.")
        if self.max_tokens < 1:
            raise InvalidRequestError(
                f"max_tokens must be at least 1, got {self.max_tokens}; "
                "leave it out for the default (256)."
            )
        if not is_number(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            raise InvalidRequestError(
                f"temperature must be between 0 and 2, got {self.temperature!r}."
            )
        if not is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}.")
        if not is_integer(self.top_k) or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be an integer >= 0, got {self.top_k!r}.")
        if not is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p!r}.")
        if not is_number(self.repeat_penalty) or not 0.0 < self.repeat_penalty <= 10.0:
            raise InvalidRequestError(
                f"repeat_penalty must be in (0, 10] (1 = off), got {self.repeat_penalty!r}.")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not is_number(value) or not -2.0 <= value <= 2.0:
                raise InvalidRequestError(f"{name} must be in [-2, 2] (0 = off), got {value!r}.")
        if self.seed is not None and (not is_integer(self.seed) or not -(2**63) <= int(self.seed) < 2**64):
            raise InvalidRequestError(f"seed must be a 64-bit integer, got {self.seed!r}.")
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if stop is None:
            stop = ()
        if isinstance(stop, list | tuple) and all(isinstance(s, str) and s for s in stop):
            stop = tuple(stop)
        else:
            raise InvalidRequestError("stop must be a string or a list of non-empty strings.")
        if len(stop) > MAX_STOP:
            raise InvalidRequestError(f"stop takes at most {MAX_STOP} strings.")
        if not isinstance(self.logprobs, bool):
            raise InvalidRequestError(f"logprobs must be true or false, got {self.logprobs!r}.")
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "response_format", normalized_format(self.response_format))
        if self.structured_outputs is not None:
            object.__setattr__(self, "response_format", self._vllm_format())
            object.__setattr__(self, "structured_outputs", None)
        self._check_tools()
        # ... and kept as Python's own, a float field as a float: temperature=0 and 0.0 key one cache
        # bucket (the key is JSON: "0" and "0.0" were two), and a cloud's JSON body can hold them
        for name in ("max_tokens", "top_k", "seed"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                     "frequency_penalty"):
            object.__setattr__(self, name, float(getattr(self, name)))

    def _vllm_format(self) -> dict[str, Any]:
        """``structured_outputs`` as the grammar's own form: a json one is OpenAI's json_schema,
        a regex or choice one ``{"type": "regex", "regex": ...}`` / ``{"type": "choice", ...}``."""
        from ._structured import ResponseFormatError, parse_structured_outputs

        if self.response_format is not None:
            raise InvalidRequestError("structured_outputs and response_format both ask for a format: "
                                      "send one of them.")
        try:
            return parse_structured_outputs(self.structured_outputs).response_format  # type: ignore[no-any-return]
        except ResponseFormatError as exc:
            raise format_error(exc, "structured_outputs") from exc

    @property
    def parses_json(self) -> bool:
        """The answer is held to a JSON format (its completion gets ``.parsed``); a regex or choice
        answer is plain text."""
        return self.response_format is not None and self.response_format.get("type") not in RAW_KINDS

    def _check_tools(self) -> None:
        """``tools``, ``tool_choice`` and ``parallel_tool_calls`` checked, the tools kept as a tuple."""
        from ._tools import check_tools, tool_choice_mode

        tools = None if self.tools is None else tuple(check_tools(self.tools))
        tool_choice_mode(self.tool_choice, list(tools or ()))
        if self.parallel_tool_calls is not None and not isinstance(self.parallel_tool_calls, bool):
            raise InvalidRequestError(
                f"parallel_tool_calls must be true or false, got {self.parallel_tool_calls!r}.")
        if tools is not None and self.response_format is not None and self.tool_choice != "none":
            raise InvalidRequestError("tools cannot be combined with response_format (a call's arguments "
                                      "follow the tool's own parameters schema): send one, or "
                                      "tool_choice='none'.")
        object.__setattr__(self, "tools", tools)

    @property
    def is_sampled(self) -> bool:
        """True when the answer is a random draw (temperature > 0 and no seed)."""
        return self.temperature > 0 and self.seed is None

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> GenerationParams:
        allowed = {f for f in cls.__dataclass_fields__}
        unknown = set(kwargs) - allowed
        if unknown:
            raise InvalidRequestError(
                f"Unknown parameter(s) {sorted(unknown)}; accepted: {sorted(allowed)}."
            )
        return cls(**{k: v for k, v in kwargs.items() if v is not None})

    def cache_key(self) -> dict[str, Any]:
        """Every setting that changes an answer (keys the semantic cache); only ``logprobs``,
        which changes what is reported and not the text, is left out. The stop strings as a set: an
        answer is cut at the first match of any of them, so ``["a", "b"]``, ``["b", "a"]`` and
        ``["a", "a", "b"]`` are one request. A penalty at 0 (off) is left out, so a request without
        penalties keys the bucket it keyed before they existed (cache files written then still hit),
        and one with a penalty never shares that bucket."""
        key = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "logprobs"}
        key["stop"] = sorted(set(self.stop))
        for name in ("presence_penalty", "frequency_penalty"):
            if key[name] == 0.0:  # -0.0 too
                del key[name]
        # plain text keys the bucket it keyed before structured output existed; a format keys its
        # own by the grammar's canonical key, so text and structured answers never meet
        if self.response_format is None:
            del key["response_format"]
        else:
            key["response_format"] = grammar_of(self.response_format).key
        del key["structured_outputs"]  # (read into response_format)
        # (a request with tools is never cached; its key still tells it apart)
        for name in ("tools", "tool_choice", "parallel_tool_calls"):
            if key[name] is None:
                del key[name]
        if self.tools is not None:
            key["tools"] = list(self.tools)
        return key


# per-call keywords an OpenAI client takes and this client takes elsewhere: what to do instead
# (`chat(model=...)`, the openai habit, was told only that 'model' is unknown; "did you mean 'min_p'?")
_OPENAI_HABITS = {
    "model": "the models are the client's, not a call's: HybridLLM(edge_model=..., cloud_model=...) "
    "(or route='edge' / route='cloud' to pick a side for one call).",
    "stream": "call client.stream(...) for an answer in chunks (with client.stream(...) as s: ...).",
    "n": "one answer a call: call chat() again, with another seed, for another.",
    "max_completion_tokens": "this client's name for it is 'max_tokens'.",
}


def check_option_names(names: Iterable[str], *, routing: Sequence[str] = ()) -> None:
    """Refuse a per-call keyword that is neither a sampling setting nor a routing option, naming
    it, the closest accepted name (a typo: ``max_token``) and every accepted one."""
    sampling = sorted(GenerationParams.__dataclass_fields__)
    unknown = sorted(set(names) - set(sampling) - set(routing))
    if not unknown:
        return
    import difflib  # only on this error path: `import hybridllm` stays light

    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, [*sampling, *routing], n=1)
        if name in _OPENAI_HABITS:
            hints.append(f"{name!r}: {_OPENAI_HABITS[name]}")
        elif close:
            hints.append(f"{name!r}: did you mean {close[0]!r}?")
    hint = " " + " ".join(hints) if hints else ""
    raise InvalidRequestError(
        f"Unknown option(s) {unknown}.{hint} Sampling options: {', '.join(sampling)}; "
        f"routing options: {', '.join(sorted(routing))}."
    )


def is_number(x: Any) -> bool:
    """A real number (:func:`is_real`) that is finite as a float: not NaN, inf or past float's range."""
    try:
        return is_real(x) and math.isfinite(x)
    except OverflowError:  # an int past float's range (10**400): raised a bare OverflowError
        return False


def is_integer(x: object) -> TypeGuard[numbers.Integral]:
    """An integer of any type (numpy's int64 too: a count read with numpy or from a model's
    config), not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x: object) -> bool:
    """A real number of any type (numpy's float32 and int64 too), not a bool; NaN and inf pass:
    the caller's own range check refuses them where they are wrong."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


# the answer's types (their long-standing home is this module: importers keep their imports)
from ._results import Chunk, Completion, Decision, Usage, read_parsed  # noqa: E402

__all__ = [
    "MAX_MODEL_CHARS", "MAX_STOP", "ROLES", "USER_TEXT", "Chunk", "Completion", "Decision",
    "GenerationParams", "Message", "Messages", "Usage", "check_option_names", "estimate_text_tokens",
    "estimate_tokens", "grammar_of", "is_integer", "is_number", "is_real", "last_user_text",
    "normalize_messages", "private_repr", "read_parsed",
]
