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

import json
import re
import secrets
import unicodedata
from collections.abc import Callable, Collection, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from ._exceptions import InvalidRequestError

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
                tools=None,  # as transformers passes them: "tools is not none" must be false
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

    def render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            return render_completion_prompt(messages)
        return render_chat_template(
            self.chat_template,
            self._with_system(messages),
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            add_generation_prompt=add_generation_prompt,
        )

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
    parts joined, a tool call's function name and arguments, the keys of an arguments object) is
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
        return [(fmt.render(messages, add_generation_prompt=add_generation_prompt) + prefix, False)]
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
    except RecursionError:
        raise InvalidRequestError("A message is nested too deeply to render.") from None
    token = _TOJSON_HOOK.set(rehide)
    try:
        rendered = fmt.render(plain_messages, add_generation_prompt=add_generation_prompt)
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
        messages, add_generation_prompt=add_generation_prompt
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
) -> list[int]:
    """The prompt's token ids (no BOS added: the caller adds it as its tokenizer would).

    ``special_ids`` maps each control-token text of the vocabulary to its id; ``encode_plain``
    tokenizes text with no special-token parsing (llama.cpp ``special=False``, a ``tokenizers``
    copy with ``encode_special_tokens=True``). See :func:`prompt_segments`.
    """
    ids: list[int] = []
    for text, control in prompt_segments(
        fmt, messages, special_ids, prefix=prefix, add_generation_prompt=add_generation_prompt
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


def _llama_markers(llm: Any) -> tuple[dict[str, int], frozenset[str]]:
    """(text -> id of each marker token, the texts of those llama.cpp matches even with
    ``special=False``). Markers: control and unknown tokens (parsed only with ``special=True``)
    and, in a BPE vocabulary, user-defined tokens: there they are the added tokens of the
    original tokenizer that were not flagged special (Qwen2.5: ``<tool_call>``, ``</tool_call>``),
    which the base vocabulary never produces. In a SentencePiece vocabulary user-defined pieces
    are part of how the model reads ordinary text (Gemma 3: ``\\n\\n``, runs of spaces, ``<table>``,
    which sentencepiece itself matches in any text), so they stay as they are."""
    from llama_cpp import llama_cpp as C

    vocab = llm._model.vocab
    mask = C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_UNKNOWN
    bpe = C.llama_vocab_type(vocab) == C.LLAMA_VOCAB_TYPE_BPE
    user = C.LLAMA_TOKEN_ATTR_USER_DEFINED if bpe else 0
    out: dict[str, int] = {}
    always: set[str] = set()
    for tid in range(llm.n_vocab()):
        attr = C.llama_vocab_get_attr(vocab, tid)
        if attr & (mask | user):
            text = C.llama_vocab_get_text(vocab, tid).decode("utf-8", errors="replace")
            if text:
                out.setdefault(text, tid)
                if not attr & mask:
                    always.add(text)
    return out, frozenset(always)


def llama_bytes(llm: Any, ids: Sequence[int], *, special: bool = False) -> bytes:
    """The bytes of ``ids`` in a ``llama_cpp.Llama``'s vocabulary (``special``: control tokens as
    their text, not nothing). llama-cpp-python's ``detokenize`` reads each token into a 32-byte
    buffer and drops a longer one whole (SmolLM2 has 47: runs of spaces or dashes, which vanished
    from answers); a longer token gets a buffer of its own size here. As ``detokenize``, the space
    a first BOS puts before the text is not the text's."""
    import ctypes

    from llama_cpp import llama_cpp as C

    vocab = llm._model.vocab
    out = bytearray()
    buf = ctypes.create_string_buffer(64)
    for token in ids:
        n = C.llama_token_to_piece(vocab, int(token), buf, len(buf), 0, special)
        if n < 0:  # too small: -n is the size it needs
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(vocab, int(token), buf, len(buf), 0, special)
        out += buf.raw[:n]
    if ids and ids[0] == llm.token_bos() and out[:1] == b" ":
        del out[:1]
    return bytes(out)


def llama_special_ids(llm: Any) -> dict[str, int]:
    """Text -> id of each marker token of a llama.cpp vocabulary (see :func:`_llama_markers`).
    ``llm`` is a ``llama_cpp.Llama``; one pass over the vocabulary (0.1 s for 262k tokens)."""
    return _llama_markers(llm)[0]


def llama_plain(llm: Any) -> tuple[dict[str, int], Callable[[str], list[int]]]:
    """(text -> id of each marker token, an encoder that reads every marker as plain text) for a
    ``llama_cpp.Llama``: the pair :func:`tokenize_prompt` takes. The encoder is llama.cpp's
    ``special=False`` tokenizer, with user-defined markers cut apart (:func:`encode_around`)."""
    specials, always = _llama_markers(llm)

    def tokenize(text: str) -> list[int]:
        return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def encode(text: str) -> list[int]:
        return encode_around(text, always, tokenize) if always else tokenize(text)

    return specials, encode


def tokenizers_plain(path: Any) -> tuple[dict[str, int], Callable[[str], list[int]]]:
    """(text -> id of each marker token, an encoder that reads them as plain text) for a Hugging
    Face ``tokenizer.json``. Markers: the special added tokens, and the added tokens not flagged
    special that the base vocabulary does not read as that one token (Qwen2.5 leaves
    ``<tool_call>``, ``<|fim_prefix|>`` ... unflagged, and ``tokenizers`` matches them in any
    text). The encoder is a copy of the tokenizer without those markers and with
    ``encode_special_tokens`` set; an unflagged token the base vocabulary itself yields for its
    text (ordinary text, such as an HTML tag a vocabulary holds whole) is kept."""
    import json
    from pathlib import Path

    from tokenizers import Tokenizer

    data = json.loads(Path(path).read_text(encoding="utf-8"))
    added = [t for t in data.get("added_tokens") or [] if t.get("content")]

    def build(keep: list[dict[str, Any]]) -> Any:
        tok = Tokenizer.from_str(json.dumps({**data, "added_tokens": keep}))
        tok.encode_special_tokens = True
        return tok

    flagged = [t for t in added if t.get("special")]
    markers: set[str] = set()
    if len(flagged) == len(added):
        plain = build(data.get("added_tokens") or [])  # the tokenizer as it is
    else:  # unflagged ones: which does the base vocabulary not yield for their text?
        base = build(flagged)
        markers = {t["content"] for t in added if not t.get("special")
                   and base.encode(t["content"], add_special_tokens=False).ids != [t["id"]]}
        kept = [t for t in added if t.get("special") or t["content"] not in markers]
        plain = base if len(kept) == len(flagged) else build(kept)
    specials = {t["content"]: int(t["id"]) for t in added if t.get("special") or t["content"] in markers}

    def encode(text: str) -> list[int]:
        return list(plain.encode(text, add_special_tokens=False).ids)

    return specials, encode
