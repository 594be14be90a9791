"""What the engine hands back: streamed deltas and whole offline results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .logprobs import TokenLogprob


@dataclass
class RequestOutput:
    """One streamed update of a request (text and tokens produced since the previous one)."""

    request_id: str
    delta_text: str
    delta_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    error: str | None = None  # why this request alone failed (finish_reason "error")
    energy: dict[str, Any] | None = None  # set on the last output by a cluster replica's meter
    logprobs: list[TokenLogprob] | None = None  # entries of the tokens this text delta starts


@dataclass
class GenerationResult:
    """A finished request of ``LLMEngine.generate`` (offline batch use)."""

    request_id: str
    text: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None  # when the request asked for them
    error: str | None = None  # why the request alone failed (finish_reason "error")
