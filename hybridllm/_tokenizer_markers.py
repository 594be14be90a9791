"""Each tokenizer's marker tokens and a plain-text encoder for them (llama.cpp, tokenizers)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._prompt_tokens import encode_around


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
