"""Tokenizing a prompt so that only the chat template's own markers become control tokens."""

from __future__ import annotations

import json
import re
import secrets
import unicodedata
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ._chat_template import _TOJSON_HOOK
from ._exceptions import InvalidRequestError
from ._message_text import _plain

if TYPE_CHECKING:
    from .prompts import PromptFormat


# -- tokenizing a prompt: only the template's own markers become control tokens -----------------

# a placeholder: a random nonce between two printable symbols, which no template trims and
# Python's repr (a list written with {{ }}) keeps as they are; | tojson(ensure_ascii=True) escapes them
_OPEN, _CLOSE = "\u27e6", "\u27e7"
_HOLE = _OPEN + "{nonce}.{index}" + _CLOSE


@lru_cache(maxsize=16)
def _special_pattern(specials: frozenset[str]) -> re.Pattern[str] | None:
    """A regex finding any of ``specials``, the longest where two start at one place (as the
    tokenizers match them). Built as a trie (``<unused0>`` ... ``<unused6241>`` share one branch)
    so each place in the text costs the length of the longest match, not one try per token."""
    trie: dict[str, Any] = {}
    for text in specials:
        if text:
            node = trie
            for ch in text:
                node = node.setdefault(ch, {})
            node[""] = {}  # a token ends here

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        if "" not in node:
            return body
        return f"(?:{body})?" if alts else ""  # greedy: the longer token first, else end here

    return re.compile(emit(trie)) if trie else None


def prompt_segments(
    fmt: PromptFormat,
    messages: Sequence[dict[str, Any]],
    specials: Collection[str],
    *,
    prefix: str = "",
    add_generation_prompt: bool = True,
    tools: Sequence[dict[str, Any]] | None = None,
) -> list[tuple[str, bool]]:
    """The prompt as ``(text, is_control_token)`` pieces, in order, that join to
    ``fmt.render(messages) + prefix``.

    A control-token piece is one of ``specials`` (the vocabulary's control-token texts) written by
    the template itself; everything else is plain text to tokenize without special parsing. Text
    between two control tokens stays one piece even where template text meets a message's text,
    so an ordinary conversation cuts exactly where the tokenizer itself cuts a whole rendered prompt
    (at every control token) and gives the same ids; only control-token text inside a message
    changes, into plain text.

    How: each control-token text inside a message (every string in it, however deep: content
    parts joined, a tool call's function name and arguments, the keys of an arguments object, and
    every string of ``tools``, the function tools the template describes to the model) is
    swapped for a placeholder unique to this call before rendering, and swapped back as plain text
    after, so the template sees the same messages and decides the same way (an empty content is
    still empty, ``| trim`` still trims). A placeholder the template wrote through ``| tojson``
    is swapped back for the marker as ``| tojson`` writes it (escaped as JSON escapes it), so the
    text is the template's own (save a key that starts with a marker, where a template asks
    ``| tojson(sort_keys=True)``); one the template cut or rewrote otherwise is refused
    (:class:`InvalidRequestError`), never passed on.
    """
    find = _special_pattern(frozenset(specials))
    if find is None:
        return [(fmt.render(messages, add_generation_prompt=add_generation_prompt, tools=tools) + prefix,
                 False)]
    nonce = f"{secrets.randbelow(10**16):016d}"  # digits: no case filter changes them
    held: list[str] = []

    def hide(match: re.Match[str]) -> str:
        held.append(match.group(0))
        return _HOLE.format(nonce=nonce, index=len(held) - 1)

    def hidden(value: Any) -> Any:
        """``value`` with the markers in every string it holds (keys too) swapped out."""
        if isinstance(value, str):
            return find.sub(hide, value)
        if isinstance(value, dict):
            return {hidden(k): hidden(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [hidden(v) for v in value]
        return value

    # a hole as written, or as | tojson(ensure_ascii=True) writes it (its symbols as \\uXXXX)
    hole = _HOLE.format(nonce=nonce, index="([0-9]+)").replace(".", r"\.")
    escaped = hole
    for ch in (_OPEN, _CLOSE):
        escaped = escaped.replace(ch, re.escape(json.dumps(ch)[1:-1]))

    def rehide(text: str, ensure_ascii: bool) -> str:
        """What ``| tojson`` wrote, each hole in it a new one for its marker as JSON writes it."""

        def swap(match: re.Match[str]) -> str:
            marker = held[int(match.group(1) or match.group(2))]
            held.append(json.dumps(marker, ensure_ascii=ensure_ascii)[1:-1])
            return _HOLE.format(nonce=nonce, index=len(held) - 1)

        return re.sub(f"{hole}|{escaped}", swap, text)

    try:
        plain_messages = [hidden(msg) for msg in _plain(fmt._with_system(messages))]
        plain_tools = hidden(list(tools)) if tools else None
    except RecursionError:
        raise InvalidRequestError("A message is nested too deeply to render.") from None
    token = _TOJSON_HOOK.set(rehide)
    try:
        rendered = fmt.render(plain_messages, add_generation_prompt=add_generation_prompt, tools=plain_tools)
    finally:
        _TOJSON_HOOK.reset(token)
    # re.split with one group: [text, index, text, index, ..., text]
    parts = re.split(hole, rendered)
    out: list[tuple[str, bool]] = []
    plain: list[str] = []
    suspect = False  # a hole's symbol left over: the message's own, or a hole the template cut
    for i, part in enumerate(parts):
        if i % 2 == 1:  # a message's control-token text, back as plain text
            plain.append(held[int(part)])
            continue
        suspect = suspect or _OPEN in part or _CLOSE in part
        start = 0
        for match in find.finditer(part):  # the template's own control tokens
            plain.append(part[start : match.start()])
            if "".join(plain):
                out.append(("".join(plain), False))
            plain, start = [], match.end()
            out.append((match.group(0), True))
        plain.append(part[start:])
    plain.append(prefix)
    if "".join(plain):
        out.append(("".join(plain), False))
    if suspect and "".join(text for text, _ in out) != fmt.render(
        messages, add_generation_prompt=add_generation_prompt, tools=tools
    ) + prefix:  # the template cut a hole or rewrote it: its marker cannot be told apart
        raise InvalidRequestError(
            "A message holds control-token text (such as <|im_end|>) in a field the model's chat "
            "template cuts or rewrites, so it cannot be kept as plain text; remove that text from "
            "the message."
        )
    return out


def tokenize_prompt(
    fmt: PromptFormat,
    messages: Sequence[dict[str, Any]],
    *,
    special_ids: Mapping[str, int],
    encode_plain: Callable[[str], Sequence[int]],
    prefix: str = "",
    add_generation_prompt: bool = True,
    tools: Sequence[dict[str, Any]] | None = None,
) -> list[int]:
    """The prompt's token ids (no BOS added: the caller adds it as its tokenizer would).

    ``special_ids`` maps each control-token text of the vocabulary to its id; ``encode_plain``
    tokenizes text with no special-token parsing (llama.cpp ``special=False``, a ``tokenizers``
    copy with ``encode_special_tokens=True``). See :func:`prompt_segments`.
    """
    ids: list[int] = []
    for text, control in prompt_segments(
        fmt, messages, special_ids, prefix=prefix, add_generation_prompt=add_generation_prompt, tools=tools
    ):
        ids.extend([special_ids[text]] if control else encode_plain(text))
    return ids


def _cut_inside(text: str, start: int, end: int) -> int:
    """A place strictly inside ``text[start:end]`` where a BPE pre-tokenizer cuts the text anyway:
    right after a letter that something other than a letter, digit, combining mark or apostrophe
    follows. Every pre-tokenizer regex these vocabularies use (GPT-2, Qwen2, Llama 3) ends a piece
    where a run of letters ends (a contraction such as ``'s`` may still join it, hence no cut before
    an apostrophe), and BPE merges never cross a piece, so tokenizing the two sides apart gives the
    ids of the whole. A marker with no such place is cut after its first character (its ids may
    then differ a little from prose, but are never the marker's id)."""
    for i in range(start + 1, end):
        before, after = text[i - 1], text[i]
        if before.isalpha() and not (after.isalnum() or after in "'\u2019"
                                     or unicodedata.category(after).startswith("M")):
            return i
    return start + 1


def encode_around(
    text: str, markers: Collection[str], encode: Callable[[str], Sequence[int]]
) -> list[int]:
    """``encode(text)``, where ``encode`` matches each of ``markers`` as its one token whatever it
    is told (llama.cpp's user-defined tokens), with every marker in ``text`` read as its characters:
    the text is cut inside each marker (:func:`_cut_inside`) and the pieces encoded apart. Text
    without a marker is encoded whole, so its ids are what they were. A marker of one character
    cannot be cut and stays its token."""
    find = _special_pattern(frozenset(m for m in markers if len(m) > 1))
    if find is None:
        return list(encode(text))
    pieces: list[str] = []

    def cut(rest: str) -> None:
        while (match := find.search(rest)) is not None:
            at = _cut_inside(rest, match.start(), match.end())
            cut(rest[:at])  # holds at most a shorter marker that starts where this one does
            rest = rest[at:]  # may hold a marker that overlapped this one's end
        pieces.append(rest)

    cut(text)
    return [i for piece in pieces if piece for i in encode(piece)]
