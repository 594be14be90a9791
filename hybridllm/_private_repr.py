"""Reprs that keep user text out of logs: a dataclass field marked ``USER_TEXT`` (a prompt, an
answer, messages) shows its size in the repr, never its text; and the message types they hold."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

Message = dict[str, Any]  # OpenAI shape: {"role": "user", "content": "..."}
Messages = list[Message]

# a field that holds the user's text (a prompt, an answer): its repr shows its size, never the
# text, so that a logged object (log.info("%r", completion)) puts no user text in the logs
USER_TEXT = {"user_text": True}


def _size_of(value: Any) -> str:
    """What a repr shows for user text: how much there is, not what it says."""
    if value is None:
        return "None"
    if isinstance(value, str):
        return f"<{len(value)} chars>"
    if isinstance(value, tuple) and value and all(isinstance(t, dict) for t in value):  # tools
        return f"<{len(value)} tool{'' if len(value) == 1 else 's'}>"
    if isinstance(value, list):  # messages
        chars = sum(len(str(m.get("content", ""))) if isinstance(m, dict) else len(str(m)) for m in value)
        return f"<{len(value)} message{'' if len(value) == 1 else 's'}, {chars} chars>"
    if isinstance(value, tuple) and all(isinstance(s, str) for s in value):  # stop strings
        if not value:
            return "()"
        sizes = ", ".join(str(len(s)) for s in value)
        return f"<{len(value)} string{'' if len(value) == 1 else 's'} of {sizes} chars>"
    return "<hidden>"


def private_repr(self: Any) -> str:
    """A dataclass's repr with its user-text fields (``metadata=USER_TEXT``) shown by size only."""
    shown = []
    for f in fields(self):
        if f.repr:
            value = getattr(self, f.name)
            shown.append(f"{f.name}={_size_of(value) if f.metadata.get('user_text') else repr(value)}")
    return f"{type(self).__name__}({', '.join(shown)})"
