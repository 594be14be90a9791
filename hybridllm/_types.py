"""Plain data types shared by the client, the backends, the router and the cache."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ._exceptions import InvalidRequestError

Message = dict[str, Any]  # OpenAI shape: {"role": "user", "content": "..."}
Messages = list[Message]

ROLES = ("system", "user", "assistant", "developer", "tool")


def normalize_messages(messages: str | Sequence[Message]) -> Messages:
    """Turn a string or a list of OpenAI-style messages into a validated list of messages."""
    if isinstance(messages, str):
        if not messages.strip():
            raise InvalidRequestError("The prompt is empty: pass a non-empty string or messages.")
        return [{"role": "user", "content": messages}]
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
        content = msg.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = "".join(
                p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
        if not isinstance(content, str):
            raise InvalidRequestError(f"messages[{i}]['content'] must be a string.")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    if not any(m["role"] == "user" for m in out):
        raise InvalidRequestError("The messages hold no user turn: add {'role': 'user', ...}.")
    return out


def last_user_text(messages: Messages) -> str:
    for msg in reversed(messages):
        if msg["role"] == "user":
            return str(msg["content"])
    return ""


@dataclass(frozen=True)
class GenerationParams:
    """Sampling settings of one request, validated on construction."""

    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False  # report the log-probability of each sampled token (for the cascade)

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise InvalidRequestError(f"max_tokens must be an integer, got {self.max_tokens!r}.")
        if self.max_tokens < 1:
            raise InvalidRequestError(
                f"max_tokens must be at least 1, got {self.max_tokens}; "
                "leave it out for the default (256)."
            )
        if not _is_number(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            raise InvalidRequestError(
                f"temperature must be between 0 and 2, got {self.temperature!r}."
            )
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}.")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError(f"top_k must be an integer >= 0, got {self.top_k!r}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidRequestError(f"seed must be an integer, got {self.seed!r}.")
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if stop is None:
            stop = ()
        if not all(isinstance(s, str) and s for s in stop):
            raise InvalidRequestError("stop must be a string or a list of non-empty strings.")
        if len(stop) > 4:
            raise InvalidRequestError("stop takes at most 4 strings.")
        object.__setattr__(self, "stop", tuple(stop))

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
        """The settings that change an answer (used to key the semantic cache)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens,
                "stop": list(self.stop)}


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


@dataclass
class Completion:
    """The answer to one request, with where it came from and how long it took."""

    text: str
    # "cache", "edge", "cloud", "edge->cloud", "edge (cloud unavailable)", or "cloud->edge" /
    # "edge->cloud->edge" when a cloud stream broke mid-answer and the device finished it
    route: str
    reason: str
    model: str
    usage: Usage = field(default_factory=Usage)
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    finish_reason: str = "stop"  # "stop" or "length"
    score: float | None = None  # the router's difficulty score, when it ran
    cache_similarity: float | None = None  # set on a cache hit
    cost_usd: float = 0.0  # estimated cloud cost of this request

    @property
    def tokens_per_s(self) -> float | None:
        """Decode speed: completion tokens after the first, over the time after the first."""
        if self.ttft_ms is None or self.usage.completion_tokens < 2:
            return None
        decode_ms = self.latency_ms - self.ttft_ms
        if decode_ms <= 0:
            return None
        return (self.usage.completion_tokens - 1) / (decode_ms / 1000.0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["usage"] = self.usage.to_dict()
        d["tokens_per_s"] = self.tokens_per_s
        return d


@dataclass
class Chunk:
    """One piece of a streamed answer. The last chunk has ``finish_reason`` set."""

    text: str
    route: str
    model: str
    finish_reason: str | None = None
    completion: Completion | None = None  # set on the last chunk: the whole answer and its trace
