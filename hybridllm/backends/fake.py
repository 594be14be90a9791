"""A fake backend for fast unit tests: echoes a scripted answer word by word."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from .._types import GenerationParams, Messages, Usage, last_user_text
from .base import Backend, Delta, register_backend


class FakeBackend(Backend):
    """Answers ``reply(messages)`` (default: echo the last user turn), one word per token."""

    name = "fake"

    def __init__(self, *, model: str = "fake-model",
                 reply: Callable[[Messages], str] | None = None, fail: Exception | None = None,
                 context_length: int = 4096, delay_s: float = 0.0,
                 logprob: float = -0.5) -> None:
        self.model = model
        self.reply = reply or (lambda msgs: f"echo: {last_user_text(msgs)}")
        self.fail = fail
        self._context_length = context_length
        self.logprob = logprob  # reported for every token when asked
        self.delay_s = delay_s  # seconds per token, to behave like a model that takes time
        self.calls: list[Messages] = []
        self.tokens_generated = 0
        self.continued: list[str] = []

    @property
    def context_length(self) -> int:
        return self._context_length

    def count_tokens(self, messages: Messages) -> int:
        return sum(len(str(m["content"]).split()) + 4 for m in messages)

    def stream_continuation(self, messages: Messages, prefix: str,
                            params: GenerationParams) -> Iterator[Delta]:
        """Continues with ``reply(messages)`` (the prefix is recorded in ``continued``)."""
        self.continued.append(prefix)
        for delta in self.stream(messages, params):
            yield Delta(" " + delta.text if delta.text and not delta.text.startswith(" ")
                        else delta.text, delta.finish_reason, delta.usage, delta.logprob)

    def stream(self, messages: Messages, params: GenerationParams) -> Iterator[Delta]:
        self.calls.append(messages)
        if self.fail is not None:
            raise self.fail
        words = self.reply(messages).split(" ")
        out = 0
        finish = "stop"
        for i, word in enumerate(words):
            if out >= params.max_tokens:
                finish = "length"
                break
            if self.delay_s:
                time.sleep(self.delay_s)
            out += 1
            self.tokens_generated += 1
            yield Delta(word if i == 0 else " " + word, logprob=self.logprob if params.logprobs else None)
        yield Delta("", finish_reason=finish, usage=Usage(self.count_tokens(messages), out))


def _factory(**kwargs: Any) -> FakeBackend:
    return FakeBackend(**kwargs)


register_backend("fake", _factory)
