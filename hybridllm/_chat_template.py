"""Rendering a model's Jinja chat template in a sandbox, as transformers renders it."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import Any

from ._exceptions import InvalidRequestError
from ._message_text import _plain

# set by prompt_segments while it renders: rewrites the placeholders in what ``| tojson`` wrote
_TOJSON_HOOK: ContextVar[Callable[[str, bool], str] | None] = ContextVar("_TOJSON_HOOK", default=None)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """``| tojson`` as transformers renders chat templates (what the models were trained on):
    keys in their given order, non-ASCII text as is, no HTML escapes. Jinja's own filter sorts the
    keys and writes "Zürich" as "Z\\u00fcrich" and "<" as "\\u003c"."""
    text = json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)
    hook = _TOJSON_HOOK.get()
    return hook(text, ensure_ascii) if hook is not None else text


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
    env.filters["tojson"] = _tojson
    return env.from_string(template)


def render_chat_template(
    template: str,
    messages: Sequence[dict[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    tools: Sequence[dict[str, Any]] | None = None,
) -> str:
    """Render a model's own Jinja chat template; a template error is an InvalidRequestError.
    ``tools``: OpenAI's function tools (``{"type": "function", "function": {...}}``), as
    transformers passes them to the templates that describe tools to the model."""
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
                # as transformers passes them: none is None ("tools is not none" must be false)
                tools=list(tools) if tools else None,
                documents=None,
                bos_token=bos_token,
                eos_token=eos_token,
                add_generation_prompt=add_generation_prompt,
                raise_exception=raise_exception,
                strftime_now=lambda f: datetime.now().strftime(f),
            )
        )
    except jinja2.TemplateError as exc:
        raise InvalidRequestError(f"The model's chat template failed: {exc}") from exc
    except InvalidRequestError:  # raise_exception's (a ValueError too): its message as it is
        raise
    except (TypeError, ValueError, RecursionError) as exc:
        # the template's own Python operations on a message shape it cannot take: a role that is
        # not a string ('<|im_start|>' + 5), a tool call without arguments (| tojson on undefined)
        raise InvalidRequestError(
            f"The model's chat template cannot render these messages: {type(exc).__name__}: {exc}"
        ) from exc


def named_chat_template(value: Any) -> str | None:
    """A ``chat_template`` value of ``tokenizer_config.json``: a string, or transformers' list of
    named templates ({"name", "template"}), whose "default" is the chat template; a ValueError
    saying what is wrong otherwise. The cloud's tokenizer and the edge's ONNX folder read it."""
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
        if value is None:
            raise ValueError(f"chat_template names no 'default' template (has {sorted(map(str, named))})")
    if value is not None and not isinstance(value, str):
        raise ValueError(f"chat_template must be a string or a list of named templates, not a "
                         f"{type(value).__name__}")
    return value or None
