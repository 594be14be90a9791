"""Turn OpenAI-style messages into a prompt string.

Chat-tuned models carry their own Jinja chat template in the GGUF metadata
(``tokenizer.chat_template``); we render it in a sandbox. Base models such as Gemma 3 270M have no
chat format: they continue text. For them a single user turn is passed through as is (so "The
capital of France is" completes naturally), and a longer conversation becomes a plain transcript
ending in "Assistant:", with "\\nUser:" as a stop string so the model does not write both sides.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any

from .._exceptions import InvalidRequestError
from .._types import Messages

COMPLETION_STOPS = ("\nUser:",)


@lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols],
    )
    return env.from_string(template)


def render_chat_template(template: str, messages: Messages, *, bos_token: str, eos_token: str) -> str:
    def raise_exception(message: str) -> None:
        raise InvalidRequestError(f"The model's chat template rejected the messages: {message}")

    return str(_compile(template).render(
        messages=messages, bos_token=bos_token, eos_token=eos_token, add_generation_prompt=True,
        raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f),
    ))


def render_completion_prompt(messages: Messages) -> str:
    """A completion-style prompt for a base model (no chat template)."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return str(messages[0]["content"])
    lines = []
    for msg in messages:
        label = {"system": "", "user": "User: ", "assistant": "Assistant: "}.get(msg["role"], "")
        lines.append(f"{label}{msg['content']}")
    return "\n".join(lines) + "\nAssistant:"
