"""Request models of the OpenAI wire format: the shared ones in ``hybridllm.wire``.

The cloud server and the local proxy accept the same bodies with the same checks (strict types,
unknown fields refused, unsupported features a 400 naming the parameter); see
``hybridllm/wire/requests.py`` for what is accepted and why.
"""

from __future__ import annotations

from hybridllm.wire.requests import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingRequest,
    StreamOptions,
    TextPart,
    parse_request,
)

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "SamplingRequest",
    "StreamOptions",
    "TextPart",
    "parse_request",
]
