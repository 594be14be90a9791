"""One place that turns OpenAI-style messages into the text a model reads, on both sides.

The edge backends (llama.cpp, ONNX Runtime) and the cloud server's tokenizer all render prompts
here, so a model sees the same text whichever side answers; that is what lets the device continue
an answer the cloud broke off, and what makes "both sides answer alike" hold.

- **Content parts**: ``content`` may be a string or a list of OpenAI parts; text parts are joined
  with newlines, any other part (an image, audio) is refused with :class:`InvalidRequestError`.
- **Chat-tuned models** carry a Jinja chat template (GGUF ``tokenizer.chat_template`` or
  ``tokenizer_config.json``); it is rendered in a sandbox. When a conversation has no system turn
  and the model's catalog entry names a ``system_prompt``, that prompt is put first.
- **Base models** (no template, e.g. Gemma 3 270M) continue text: a lone user turn is passed
  through as is ("The capital of France is" completes naturally); a longer conversation becomes a
  transcript ending in ``"Assistant:"``, with ``"\\nUser:"`` as a stop string.

    fmt = PromptFormat(chat_template=tpl, bos_token="<s>", eos_token="</s>", system_prompt=None)
    prompt = fmt.render(messages); stops = fmt.stops(messages)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from ._exceptions import InvalidRequestError

COMPLETION_STOPS = ("\nUser:",)
_LABELS = {"system": "", "developer": "", "user": "User: ", "assistant": "Assistant: "}

__all__ = [
    "COMPLETION_STOPS",
    "PromptFormat",
    "default_system_prompt",
    "render_chat_template",
    "render_completion_prompt",
    "text_of_content",
]


LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD. JSON may escape half an emoji
    ("\\ud83d"), and Python decodes it as is; such a string cannot be encoded as UTF-8, which the
    tokenizers and llama.cpp need (a UnicodeEncodeError or TypeError otherwise). For bulk text
    (training files, the embedder's callers); a request's messages are refused instead."""
    return LONE_SURROGATE.sub("\ufffd", text) if LONE_SURROGATE.search(text) else text


def checked_text(text: str, where: str) -> str:
    """``text``, or InvalidRequestError when it holds a lone surrogate (as the HTTP servers refuse
    such a string in a JSON body)."""
    if LONE_SURROGATE.search(text):
        raise InvalidRequestError(
            f"{where} holds a lone UTF-16 surrogate (such as \\ud83d, half of an emoji), which is "
            "not valid text; pass well-formed Unicode."
        )
    return text


def text_of_content(content: Any, *, where: str = "content") -> str:
    """The text of a message's ``content``: a string, or OpenAI content parts (text only); text
    that is not valid Unicode is refused (:func:`checked_text`)."""
    if isinstance(content, str):
        return checked_text(content, where)
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise InvalidRequestError(
                    f"{where}[{j}] must be an object like {{'type': 'text', 'text': '...'}}."
                )
            if part.get("type") != "text":
                raise InvalidRequestError(
                    f"{where}[{j}] has type {part.get('type')!r}; only 'text' parts are supported "
                    "(these models read text only)."
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequestError(
                    f"{where}[{j}]['text'] must be a string, got {type(text).__name__}."
                )
            texts.append(checked_text(text, f"{where}[{j}]['text']"))
        return "\n".join(texts)
    raise InvalidRequestError(f"{where} must be a string or a list of text parts.")


def _plain(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with string content (parts joined), other keys kept for the template."""
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise InvalidRequestError(f"messages[{i}] must be an object with 'role' and 'content'.")
        out.append(
            {**msg, "content": text_of_content(msg.get("content", ""), where=f"messages[{i}]['content']")}
        )
    return out


@lru_cache(maxsize=16)
def _compile(template: str) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        loader=jinja2.BaseLoader(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols],
    )
    return env.from_string(template)


def render_chat_template(
    template: str,
    messages: Sequence[dict[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
) -> str:
    """Render a model's own Jinja chat template; a template error is an InvalidRequestError."""
    import jinja2

    def raise_exception(message: str) -> None:
        raise InvalidRequestError(f"The model's chat template rejected the messages: {message}")

    try:
        compiled = _compile(template)
    except jinja2.TemplateError as exc:
        raise InvalidRequestError(f"The model's chat template does not compile: {exc}") from exc
    try:
        return str(
            compiled.render(
                messages=_plain(messages),
                bos_token=bos_token,
                eos_token=eos_token,
                add_generation_prompt=add_generation_prompt,
                raise_exception=raise_exception,
                strftime_now=lambda f: datetime.now().strftime(f),
            )
        )
    except jinja2.TemplateError as exc:
        raise InvalidRequestError(f"The model's chat template failed: {exc}") from exc


def render_completion_prompt(messages: Sequence[dict[str, Any]]) -> str:
    """A completion-style prompt for a base model (no chat template)."""
    msgs = _plain(messages)
    if len(msgs) == 1 and msgs[0].get("role") == "user":
        return str(msgs[0]["content"])
    lines = [f"{_LABELS.get(str(m.get('role')), '')}{m['content']}" for m in msgs]
    return "\n".join(lines) + "\nAssistant:"


def default_system_prompt(model_id: str | None) -> str | None:
    """The system prompt the catalog names for ``model_id`` (None for none or an unknown id).
    SmolLM2-135M answers far better with one: with its template's built-in prompt, greedy decoding
    of "What is the capital of France?" drifts into French prose; with ours it says Paris."""
    if not model_id:
        return None
    from .models.catalog import load_catalog

    spec = load_catalog().get(model_id)
    return (spec.extra.get("system_prompt") or None) if spec is not None else None


@dataclass(frozen=True)
class PromptFormat:
    """How one model reads a conversation: its template (None for a base model), its BOS/EOS
    text, and the system prompt used when a conversation brings none ("" or None: never)."""

    chat_template: str | None = None
    bos_token: str = ""
    eos_token: str = ""
    system_prompt: str | None = None

    @property
    def kind(self) -> str:
        """``"template"`` (chat-tuned) or ``"completion"`` (base model)."""
        return "template" if self.chat_template else "completion"

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            return render_completion_prompt(messages)
        msgs = list(messages)
        if self.system_prompt and not any(
            isinstance(m, dict) and m.get("role") in ("system", "developer") for m in msgs
        ):
            msgs = [{"role": "system", "content": self.system_prompt}, *msgs]
        return render_chat_template(
            self.chat_template,
            msgs,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            add_generation_prompt=add_generation_prompt,
        )

    def stops(self, messages: Sequence[dict[str, Any]]) -> tuple[str, ...]:
        """Extra stop strings this format needs (a base model must not write the user's turn)."""
        if not self.chat_template and len(messages) > 1:
            return COMPLETION_STOPS
        return ()
