"""The text of a message: content parts joined, lone UTF-16 surrogates refused or replaced."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ._exceptions import InvalidRequestError

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


def check_namespace(namespace: Any, error: type[Exception]) -> str:
    """``namespace``, as a cache namespace may be, or ``error`` saying why not: the one rule of
    the cache (put, clear, its default), a call's ``namespace=`` and the ``namespace`` setting.

    A non-empty string: "" is not the default namespace (a tenant named "" would read its answers).
    Valid text: it is stored as UTF-8, which half an emoji (a lone surrogate, as bytes that are
    not UTF-8 in argv or the environment arrive) cannot be."""
    if not isinstance(namespace, str) or not namespace:
        raise error(f"namespace must be a non-empty string, got {namespace!r}.")
    if LONE_SURROGATE.search(namespace):
        raise error(f"namespace holds a lone UTF-16 surrogate (such as \\ud83d, half of an emoji, or "
                    f"bytes that are not UTF-8), which is not valid text: {namespace!r}.")
    return namespace


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
    """Messages with string content (parts joined), other keys kept for the template. As
    :func:`hybridllm._types.normalize_messages` does: "developer" (OpenAI's new name for "system",
    which no chat template knows) is "system", and an assistant turn's null content (a turn that
    only called tools) is ""."""
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise InvalidRequestError(f"messages[{i}] must be an object with 'role' and 'content'.")
        content = msg.get("content", "")
        if content is None and msg.get("role") == "assistant":
            content = ""
        role = {"role": "system"} if msg.get("role") == "developer" else {}
        out.append(
            {**msg, **role, "content": text_of_content(content, where=f"messages[{i}]['content']")}
        )
    return out


def calls_for_template(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with each earlier tool call's ``arguments`` as the templates write it (what
    the servers do to a request's conversation before its template: a device model's prompt gets
    the same). The renderer itself passes them as given, as transformers does."""
    return [{**m, "tool_calls": [_call_for_template(c) for c in m["tool_calls"]]}
            if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list) else m
            for m in messages]


def _call_for_template(call: Any) -> Any:
    """An earlier tool call as the templates write it: its ``arguments``, a JSON text on the wire,
    as the object they write with ``| tojson`` (as transformers and vLLM pass it); a text that is
    not JSON stays a text."""
    fn = call.get("function") if isinstance(call, dict) else None
    args = fn.get("arguments") if isinstance(fn, dict) else None
    if not isinstance(fn, dict) or not isinstance(args, str):
        return call
    try:
        value = json.loads(args) if args.strip() else {}
    except ValueError:
        return call
    return {**call, "function": {**fn, "arguments": value}}
