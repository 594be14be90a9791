"""A tokenizer's vocabulary as the bytes each token adds to an output."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

# A SentencePiece byte-fallback token: one raw byte, written <0xNN>.
BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.cache
def byte_level_alphabet() -> dict[str, int]:
    """A byte-level BPE vocabulary writes each byte as one printable character: bytes that are
    printable Latin-1 stay themselves, the others become U+0100 onward in byte order. Inverted here:
    character -> byte (the cloud server's tokenizer reads pieces through it too)."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in kept}
    moved = [b for b in range(256) if b not in table.values()]
    table.update({chr(0x100 + n): b for n, b in enumerate(moved)})
    return table


def token_bytes_from_tokenizer(tok: Any) -> list[bytes | None]:
    """Per id of a ``tokenizers.Tokenizer``: the bytes the token adds to an output (byte-level BPE,
    or SentencePiece pieces with "▁" for a space and <0xNN> byte tokens); None for a special
    (control) token."""
    size = tok.get_vocab_size(with_added_tokens=True)
    state = json.loads(tok.to_str())
    special = {int(t["id"]) for t in state.get("added_tokens") or [] if t.get("special")}
    decoder = json.dumps(state.get("decoder") or {})
    byte_level = '"ByteLevel"' in decoder
    table = byte_level_alphabet() if byte_level else {}
    out: list[bytes | None] = []
    for i in range(size):
        piece = tok.id_to_token(i)
        if piece is None or i in special:
            out.append(None)
            continue
        if byte_level:
            try:
                out.append(bytes(table[c] for c in piece) or None)
            except KeyError:  # an added (non-special) token kept as plain text
                out.append(piece.encode() or None)
            continue
        m = BYTE_PIECE.fullmatch(piece)
        if m:
            out.append(bytes((int(m.group(1), 16),)))
        else:
            out.append(piece.replace("\u2581", " ").encode() or None)
    return out
