"""The text of an answer's first ``n`` ids, read from a checkpoint instead of decoding them all.

Decoding the whole answer at each step (the detokenizer's text, the logprobs' offsets) cost the
square of its length: a 4,000-token answer spent tens of seconds of the engine thread decoding.
The checkpoint is the text of the answer's first ids, ending with a whole character, and its last
few ids (context) with their own decode; a later prefix is the checkpoint's text, then what the
ids after it add, read after the context (so a SentencePiece word keeps its space and the bytes of
a character split over ids read as in the whole answer). Where the context reads otherwise there,
the caller decodes the whole prefix: a byte-fallback decoder (SentencePiece) reads a run of byte
ids as U+FFFD each while the character at its end is incomplete, a run that may start before the
context.
"""

from __future__ import annotations

from collections.abc import Callable

# ids decoded again before the new ones: the context's shortest length
CONTEXT = 6


class TextCheckpoint:
    """One answer's checkpoint; its ids only grow (earlier ids never change).

    ``byte_runs``: where the context reads otherwise and the new ids end inside a character, the
    checkpoint's text stays and the new ids read after it (the logprobs' offsets: each byte of a
    split character points at that character); else such a prefix has no text here."""

    def __init__(self, decode: Callable[[list[int]], str], *, byte_runs: bool = False) -> None:
        self._decode = decode
        self._byte_runs = byte_runs
        self.done, self.done_text = 0, ""  # the checkpoint: the text of the first ``done`` ids
        self._ctx_ids: list[int] = []  # the last ids before it, with their own decode
        self._ctx_text = ""

    def _holds(self, ids: list[int], n: int) -> bool:
        start = self.done - len(self._ctx_ids)
        return bool(self.done) and n >= self.done and ids[start : self.done] == self._ctx_ids

    def read(self, ids: list[int], n: int) -> str | None:
        """The text of ``ids[:n]``: the checkpoint's text, then what the ids after it add, read
        after its context; None where there is no checkpoint or its context reads otherwise."""
        if not self._holds(ids, n):
            return None
        tail = self._decode(ids[self.done - len(self._ctx_ids) : n])
        if tail.startswith(self._ctx_text):
            return self.done_text + tail[len(self._ctx_text) :]
        if self._byte_runs and tail.endswith("\ufffd"):
            # A byte-fallback decoder reads a run of byte ids as U+FFFD each while the character
            # at its end is incomplete, the whole characters before it too: those stay as the
            # checkpoint has them, the new ids read after it.
            return self.done_text + self._decode(ids[self.done : n])
        return None

    def decode(self, ids: list[int], n: int) -> str:
        """The text of ``ids[:n]``, from the checkpoint where it reads the same, else decoded whole."""
        text = self.read(ids, n)
        return self._decode(list(ids[:n])) if text is None else text

    def only_bytes_after(self, ids: list[int], n: int) -> bool:
        """Whether the checkpoint holds for ``ids`` and the ids after it, up to ``n``, read alone as
        U+FFFD each: bytes of a character still incomplete, or bytes that are no character."""
        k = n - self.done
        return k > 0 and self._holds(ids, n) and self._decode(ids[self.done : n]) == "\ufffd" * k

    def advance(self, ids: list[int], n: int, text: str) -> None:
        """Move the checkpoint to ``n`` (``text`` is the text of ``ids[:n]``) where it ends with a
        whole character and a context of its last ids reads alone as it does there. A context
        that starts inside a character split over byte ids reads as U+FFFD: one of four lengths
        in a row starts on a character's first byte. A context with no text (special ids) would
        join byte ids across it: none."""
        if n <= self.done or not text or text.endswith("\ufffd"):
            return
        for size in range(CONTEXT, CONTEXT + 4):
            ctx_ids = list(ids[max(0, n - size) : n])
            ctx_text = self._decode(ctx_ids)
            if ctx_text and text.endswith(ctx_text):
                self._ctx_ids, self._ctx_text = ctx_ids, ctx_text
                self.done, self.done_text = n, text
                return
            if size >= n:
                return
