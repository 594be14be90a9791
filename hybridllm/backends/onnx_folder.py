"""Reading a prepared ONNX folder: its prompt files, end-of-text tokens, context size, how to rebuild it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from .._chat_template import named_chat_template
from .._exceptions import ConfigError, ModelCorruptError
from ..models.onnx_store import META_FILE, onnx_dir, prepare_command, read_meta

log = logging.getLogger("hybridllm.edge")


def _reprepare_hint(folder: Path, spec: Any, precision: str) -> str:
    """What to do about a broken prepared folder: the command that builds it again (and, for a
    folder copied elsewhere, where to copy the result)."""
    if spec is None:
        return (
            f"Prepare it again with `{prepare_command('ID')} --force` (ID: the catalog model it was "
            f"built from) and copy the folder it prints to {folder}, or rebuild it with the model "
            "builder."
        )
    try:
        precision = str(read_meta(folder).get("precision") or precision)
    except ModelCorruptError:
        pass
    command = f"`{prepare_command(spec.id, precision)} --force`"
    if folder.resolve() == onnx_dir(spec.id, precision).resolve():
        return f"Prepare it again with {command}."
    return f"Prepare it again with {command} and copy the folder it prints to {folder}."


def _context_size(n_ctx: int, trained: int, folder: Path) -> int:
    """The context a request may fill, as on llama.cpp: n_ctx=0 is the model's own length, and an
    n_ctx past it is cut to it with a warning (before: n_ctx=0 refused every prompt)."""
    if n_ctx == 0:
        if trained <= 0:
            raise ConfigError(
                f"n_ctx=0 asks for the model's own context length, and {folder / 'genai_config.json'} "
                "names none (model.context_length): pass n_ctx, a whole number of tokens.")
        return trained
    if 0 < trained < n_ctx:
        log.warning("n_ctx=%d is more than %s was built for (%d tokens); its context is %d",
                    n_ctx, folder.name, trained, trained)
        return trained
    return n_ctx


# the token texts llama.cpp's vocabulary loader marks end-of-generation by name (llama-vocab.cpp)
_EOG_NAMES = frozenset({
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<EOT>",
    "_<EOT>", "<|end\u2581of\u2581sentence|>", "<end_of_utterance>",
})


def _named_eog_ids(folder: Path) -> set[int]:
    """Ids of the special tokens in ``folder``'s tokenizer.json named in :data:`_EOG_NAMES`."""
    try:
        added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens") or []
        return {int(t["id"]) for t in added if t.get("special") and t.get("content") in _EOG_NAMES}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return set()


def _prompt_files(folder: Path, meta: dict[str, Any]) -> tuple[str | None, str, str, bool]:
    """(chat template, BOS text, EOS text, add BOS) from our record, else the builder's files.

    The chat template as transformers (and the cloud server) reads it: ``chat_template.jinja`` over
    the one in our record or ``tokenizer_config.json``, which may also be a list of named templates
    ({"name", "template"}) whose "default" is the chat template. A file that cannot be read is a
    :class:`ModelCorruptError` (before: ignored, and the folder's prompt format silently lost)."""
    tok_config: dict[str, Any] = {}
    path = folder / "tokenizer_config.json"
    if path.is_file():
        try:
            tok_config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ModelCorruptError(f"{path} is unreadable ({exc}).") from exc
        if not isinstance(tok_config, dict):
            raise ModelCorruptError(f"{path} must hold a JSON object, not a {type(tok_config).__name__}.")
    jinja = folder / "chat_template.jinja"
    template: str | None
    if jinja.is_file():
        try:
            template = jinja.read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:
            raise ModelCorruptError(f"{jinja} is unreadable ({exc}).") from exc
    else:
        template = (_named_template(meta.get("chat_template"), folder / META_FILE)
                    or _named_template(tok_config.get("chat_template"), path))

    def text(key: str) -> str:
        value = meta.get(key) or tok_config.get(key) or ""
        return str(value.get("content", "")) if isinstance(value, dict) else str(value)

    add_bos = bool(meta.get("add_bos_token", tok_config.get("add_bos_token", False)))
    return template or None, text("bos_token"), text("eos_token"), add_bos


def _named_template(template: Any, path: Path) -> str | None:
    """A ``chat_template`` value (``named_chat_template``) of the file at ``path``."""
    try:
        return named_chat_template(template)
    except ValueError as exc:
        raise ModelCorruptError(f"{path}: {exc}.") from exc
