"""The semantic cache's keys: a request's bucket (namespace, model, settings, context) and an entry's id."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .._exceptions import InvalidRequestError
from ..prompts import text_of_content
from .guards import exact_key


def split_messages(messages: list[dict]) -> tuple[list[dict], str]:
    """(context: every message but the last user turn, the last user turn's text)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of {'role', 'content'} dicts")
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if not isinstance(msg, dict) or "role" not in msg:
            raise InvalidRequestError(f"messages[{i}] must be a dict with a 'role'")
        if msg["role"] == "user":
            context = [_canonical(m) for j, m in enumerate(messages) if j != i]
            if (turn := _turn_key(msg, i, len(messages))) is not None:
                context.append(turn)
            return context, _text_of(msg.get("content"))
    raise InvalidRequestError("messages hold no user turn to look up")


def _turn_key(msg: dict, at: int, total: int) -> dict | None:
    """What the model sees of the last user turn besides its text: its ``name`` ("what is my
    name?" asked by two users) and its place when turns follow it (a greeting before the question
    or an assistant prefill after it). None in the usual case, the question last and unnamed, so
    the buckets of entries written before this key existed stay the same."""
    turn: dict[str, Any] = {}
    if msg.get("name") is not None:
        turn["name"] = msg["name"]
    if at != total - 1:
        turn["at"] = at
    # a key no message holds (those keep role, name and content only): never equal to a turn
    return {"last_user_turn": turn} if turn else None


def _canonical(msg: dict) -> dict:
    return {k: msg[k] for k in ("role", "name", "content") if k in msg}


def _text_of(content: Any) -> str:
    return text_of_content(content, where="the last user turn's content")


def bucket_key(namespace: str, model: str, params_key: dict, context: list[dict]) -> str:
    blob = json.dumps(
        {"ns": namespace, "model": model, "params": params_key, "context": context},
        sort_keys=True,
        ensure_ascii=False,
        default=str,
    )
    # surrogatepass: an earlier turn holding half an emoji keys its own bucket instead of raising
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def entry_id_for(bucket: str, query: str) -> str:
    key = f"{bucket}\x00{exact_key(query)}"
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
