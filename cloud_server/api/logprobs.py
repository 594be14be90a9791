"""Token log-probabilities in OpenAI's chat and legacy completion shapes."""

from __future__ import annotations

import math
from typing import Any

# A logprob of -inf (a token the model rules out) is no JSON number: OpenAI's floor instead.
_FLOOR = -9999.0


def _logprob(value: float) -> float | None:
    """A log-probability as JSON can carry it: -inf floored (above); NaN or +inf (logits that
    overflowed) is no figure at all, sent as null as vLLM's responses do. Before, a NaN made the
    whole answer a 500 (its text lost) and put a bare ``NaN`` in a stream's chunk."""
    if math.isnan(value) or value == math.inf:
        return None
    return max(value, _FLOOR)


def _token(decode: Any, token_id: int, token_bytes: Any = None) -> str:
    """The token's text: its own bytes' where the tokenizer gives them (a SentencePiece token
    "▁a" decoded alone loses its space, its bytes keep it), so ``token`` reads as ``bytes``."""
    if token_bytes is not None:
        return token_bytes(token_id).decode("utf-8", errors="replace")
    return decode([token_id])


def _textless(token_id: int, names: dict[int, str] | None) -> str:
    """The name of a token that adds no text (a control token such as ``<|im_end|>``, an id past
    the tokenizer's list): its marker's name where the tokenizer has one, else vLLM's
    ``token_id:N``. Every such token read "", so a legacy ``top_logprobs`` dict (keyed by name)
    kept one of them, with another's logprob, and a chat entry did not say which token it was."""
    name = (names or {}).get(token_id)
    return name if name else f"token_id:{token_id}"


def chat_logprobs(entries: list[Any], decode: Any, token_bytes: Any = None, *,
                  names: dict[int, str] | None = None) -> dict[str, Any]:
    """OpenAI's chat shape: ``{"content": [{token, logprob, bytes, top_logprobs}]}``. ``bytes`` are
    the token's own (``token_bytes``): a token that is only part of a character has its text
    U+FFFD but its real bytes, so the entries' bytes joined are the answer's UTF-8. A token that
    adds no text is named (``_textless``; ``names``: the tokenizer's markers), its ``bytes`` empty."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        if token_bytes is None:
            text = _token(decode, token_id)
            raw = text.encode("utf-8")
        else:  # one call: the text is the bytes' (_token)
            raw = token_bytes(token_id)
            text = raw.decode("utf-8", errors="replace")
        return {"token": text or _textless(token_id, names), "logprob": _logprob(logprob), "bytes": list(raw)}

    return {"content": [
        {**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]} for e in entries
    ]}


def text_logprobs(entries: list[Any], decode: Any, token_bytes: Any = None, *,
                  names: dict[int, str] | None = None) -> dict[str, Any]:
    """The legacy shape: parallel lists; each ``top_logprobs`` dict holds the N most likely
    tokens and the emitted one (so up to N + 1 entries, as OpenAI's); offsets into ``text``.
    This shape has no ``bytes``: a token that is only part of a character is named by its bytes,
    as OpenAI does (``bytes:\\xe6\\x97``), so such tokens neither read as U+FFFD nor share one
    key in a ``top_logprobs`` dict (which kept one of them and lost the others); a token that adds
    no text is named too (``_textless``), for the same reason."""

    def name(token_id: int) -> str:
        text = _token(decode, token_id, token_bytes)
        if not text:
            return _textless(token_id, names)
        if "\ufffd" in text and token_bytes is not None:
            raw = token_bytes(token_id)
            if raw != text.encode("utf-8"):
                return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        return text

    tops = []
    for e in entries:
        top = {name(t): _logprob(lp) for t, lp in e.top}
        top.setdefault(name(e.token_id), _logprob(e.logprob))
        tops.append(top)
    return {
        "tokens": [name(e.token_id) for e in entries],
        "token_logprobs": [_logprob(e.logprob) for e in entries],
        "top_logprobs": tops,
        "text_offset": [e.text_offset for e in entries],
    }
