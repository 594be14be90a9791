"""One place that turns OpenAI-style messages into the text a model reads, on both sides.

The edge backends (llama.cpp, ONNX Runtime) and the cloud server's tokenizer all render prompts
here, so a model sees the same text whichever side answers; that is what lets the device continue
an answer the cloud broke off, and what makes "both sides answer alike" hold.

- **Content parts**: ``content`` may be a string or a list of OpenAI parts; text parts are joined
  with newlines, any other part (an image, audio) is refused with :class:`InvalidRequestError`.
- **Chat-tuned models** carry a Jinja chat template (GGUF ``tokenizer.chat_template`` or
  ``tokenizer_config.json``); it is rendered in a sandbox as transformers renders it (its
  ``| tojson``: keys in order, text unescaped; ``tools`` and ``documents`` None). When a
  conversation has no system turn and the model's catalog entry names a ``system_prompt``, that
  prompt is put first.
- **Base models** (no template, e.g. Gemma 3 270M) continue text: a lone user turn is passed
  through as is ("The capital of France is" completes naturally); any other conversation becomes a
  transcript ending in ``"Assistant:"`` (tool results labelled ``"Tool:"``), with ``"\\nUser:"``
  as a stop string, and ``"\\nTool:"`` where it has a tool turn (a past answer that starts with a
  space, as the model's own do, follows ``"Assistant:"`` without another).
- **Roles**: ``"developer"`` (OpenAI's new name for ``"system"``) is rendered as ``"system"``.

- **Control tokens come from the template only** (:func:`tokenize_prompt`): the text of a message
  (any field: content, role, name) and the assistant ``prefix`` is tokenized as plain text, so a
  user who writes ``<|im_end|>`` or ``<|endoftext|>`` gets those characters, never the control token
  (a forged system turn or an early end of the prompt); only the markers the template itself writes
  become special tokens. Added tokens that are not flagged special but exist only as markers (Qwen's
  ``<tool_call>``: outside the base vocabulary, yet matched by llama.cpp even with ``special=False``
  and by ``tokenizers`` in any text) are markers too: in a message they get the ids of their
  characters, as the base vocabulary reads them (:func:`llama_plain`, :func:`tokenizers_plain`).

    fmt = PromptFormat(chat_template=tpl, bos_token="<s>", eos_token="</s>", system_prompt=None)
    prompt = fmt.render(messages); stops = fmt.stops(messages)
    ids = tokenize_prompt(fmt, messages, special_ids={"<|im_end|>": 2}, encode_plain=encode)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._chat_template import render_chat_template
from ._message_text import (
    LONE_SURROGATE,  # noqa: F401 (re-export; importer: hybridllm/wire/body.py)
    _plain,
    checked_text,  # noqa: F401 (re-export; importers: _types.py, cloud_server/models/tokenizer.py)
    text_of_content,
    valid_text,  # noqa: F401 (re-export; importers: cache/encoder.py, semantic.py, router/dataset.py, label.py)
)
from ._prompt_tokens import encode_around, prompt_segments, tokenize_prompt
from ._tokenizer_markers import (
    llama_bytes,  # noqa: F401 (re-export; importers: backends/llama_cpp.py, cloud_server/models/tokenizer.py)
    llama_plain,
    llama_special_ids,
    tokenizers_plain,
)

COMPLETION_STOPS = ("\nUser:",)
TOOL_STOP = "\nTool:"  # a transcript with tool results: the model must not write one either
_LABELS = {"system": "", "developer": "", "user": "User: ", "assistant": "Assistant: ", "tool": "Tool: "}

__all__ = [
    "COMPLETION_STOPS",
    "PromptFormat",
    "default_system_prompt",
    "encode_around",
    "llama_plain",
    "llama_special_ids",
    "render_chat_template",
    "render_completion_prompt",
    "prompt_segments",
    "text_of_content",
    "tokenize_prompt",
    "tokenizers_plain",
]


def render_completion_prompt(messages: Sequence[dict[str, Any]]) -> str:
    """A completion-style prompt for a base model (no chat template)."""
    msgs = _plain(messages)
    if len(msgs) == 1 and msgs[0].get("role") == "user":
        return str(msgs[0]["content"])
    lines = []
    for m in msgs:
        label = _LABELS.get(str(m.get("role")), "")
        if m.get("role") == "assistant" and m["content"].startswith(" "):
            # the model's own answer to "Assistant:" starts with its space (" 4"): a second one
            # after the label would show it a gap it never wrote
            label = label.rstrip(" ")
        lines.append(f"{label}{m['content']}")
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

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True,
               tools: Sequence[dict[str, Any]] | None = None) -> str:
        """The prompt text; ``tools`` (function tools) reach a chat template (none other has them)."""
        if not self.chat_template:
            return render_completion_prompt(messages)
        return render_chat_template(
            self.chat_template,
            self._with_system(messages),
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
        )

    def renders_tools(self) -> bool:
        """Whether the chat template describes function tools to the model (reads ``tools``)."""
        return bool(self.chat_template) and re.search(r"\btools\b", self.chat_template or "") is not None

    def _with_system(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with the default system prompt first when a template conversation has none."""
        msgs = list(messages)
        if self.chat_template and self.system_prompt and not any(
            isinstance(m, dict) and m.get("role") in ("system", "developer") for m in msgs
        ):
            msgs = [{"role": "system", "content": self.system_prompt}, *msgs]
        return msgs

    def stops(self, messages: Sequence[dict[str, Any]]) -> tuple[str, ...]:
        """Extra stop strings this format needs (a base model must not write the user's turn)."""
        lone_user = len(messages) == 1 and isinstance(messages[0], dict) and messages[0].get("role") == "user"
        if self.chat_template or lone_user:  # a lone user turn is passed through: no transcript
            return ()
        if any(isinstance(m, dict) and m.get("role") == "tool" for m in messages):
            return (*COMPLETION_STOPS, TOOL_STOP)
        return COMPLETION_STOPS
