"""What a request gives back: the route ``Decision``, the ``Completion`` (its ``Usage``) and the
streamed ``Chunk``s. Imported from ``hybridllm._types`` too, their long-standing home."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ._private_repr import USER_TEXT, Message, Messages, private_repr

if TYPE_CHECKING:
    from ._tools import ToolCall, ToolCallDelta


@dataclass(frozen=True)
class Decision:
    """Where one request goes and why: the plan step's single answer."""

    route: str  # "edge" or "cloud"
    reason: str
    score: float | None = None  # the router's difficulty score, when it ran
    # redacted when privacy="redact"; in repr by size only (user text)
    messages_for_cloud: Messages = field(default_factory=list, metadata=USER_TEXT)
    pii_kinds: list[str] = field(default_factory=list)
    cascade: bool = False  # edge first; the cloud when the edge's answer is unsure
    forced: bool = False  # the caller chose the route
    private: bool = False  # privacy keeps the prompt on the device: never sent to the cloud
    # privacy="redact": placeholder ("[EMAIL_1]") -> the value it stands for, to restore the cloud's
    # answer on the device; never sent, and kept out of repr so that a logged decision holds no value
    placeholders: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    __repr__ = private_repr


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # energy and carbon of a cloud request (hybridllm.carbon); not part of the OpenAI usage object
    energy_j: float | None = None
    energy_source: str | None = None  # what the server measured with ("nvml", "rapl", ...) or "estimate"
    region: str | None = None
    co2_g: float | None = None
    co2_saved_g: float | None = None  # vs the fastest endpoint (hybridllm.carbon)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


@dataclass
class Completion:
    """The answer to one request, with where it came from and how long it took. Its repr shows
    the text's length, not the text (``.text`` has it)."""

    text: str = field(metadata=USER_TEXT)
    # "cache", "edge", "cloud", "edge->cloud", "edge (cloud unavailable)", or "cloud->edge" /
    # "edge->cloud->edge" when a cloud stream broke mid-answer and the device finished it
    route: str
    reason: str
    model: str
    usage: Usage = field(default_factory=Usage)
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    finish_reason: str = "stop"  # "stop", "length", or "content_filter" (a hosted cloud's filter)
    score: float | None = None  # the router's difficulty score, when it ran
    cache_similarity: float | None = None  # set on a cache hit
    cost_usd: float = 0.0  # estimated cloud cost of this request
    mean_logprob: float | None = None  # mean log-probability of the edge's answer tokens, if known
    # energy and carbon, when the cloud answered (hybridllm.carbon; the server's usage.energy)
    energy_j: float | None = None
    energy_source: str | None = None
    region: str | None = None
    co2_g: float | None = None
    co2_saved_g: float | None = None  # against always using the fastest cloud endpoint
    # the functions the answer calls (a request with tools; finish_reason "tool_calls"), in order
    tool_calls: list[ToolCall] = field(default_factory=list)

    __repr__ = private_repr

    def message(self) -> Message:
        """The answer as the assistant turn to append to the conversation (OpenAI's shape): its
        text, and its ``tool_calls`` when it calls tools; then each call's result as a ``tool``
        turn, and ask again."""
        out: Message = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            out["content"] = self.text or None
            out["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        return out

    @property
    def parsed(self) -> Any:
        """The answer read as JSON (``json.loads(text)``) when ``chat()`` or ``stream()`` (its
        ``completion``) was asked for JSON (``response_format``, or ``structured_outputs``'
        ``json``); None without one, for a ``choice`` or ``regex`` (plain text), and when the
        text is not JSON (an answer cut by max_tokens: ``finish_reason``
        "length"). Not part of :meth:`to_dict`."""
        return self.__dict__.get("_parsed")

    @property
    def energy_j_per_token(self) -> float | None:
        """Joules per completion token, when the energy is known."""
        n = self.usage.completion_tokens
        return self.energy_j / n if self.energy_j is not None and n else None

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
    """One piece of a streamed answer. The last chunk has ``finish_reason`` set. Its repr shows
    the text's length, not the text."""

    text: str = field(metadata=USER_TEXT)
    route: str
    model: str
    finish_reason: str | None = None
    completion: Completion | None = None  # set on the last chunk: the whole answer and its trace
    # pieces of the answer's tool calls, as OpenAI streams them (a call's first piece names it,
    # later ones add to its arguments); the last chunk's completion has them whole
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    __repr__ = private_repr

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, as :meth:`Completion.to_dict` (the last chunk's ``completion`` in that form)."""
        out: dict[str, Any] = {"text": self.text, "route": self.route, "model": self.model,
               "finish_reason": self.finish_reason,
               "completion": self.completion.to_dict() if self.completion is not None else None}
        if self.tool_calls:
            out["tool_calls"] = [d.to_dict() for d in self.tool_calls]
        return out


def read_parsed(completion: Completion) -> None:
    """Set ``completion.parsed`` from its text (left None when the text is not JSON)."""
    import json

    try:
        completion.__dict__["_parsed"] = json.loads(completion.text)
    except ValueError:
        pass
