"""Incremental detokenization with stop strings.

Each step decodes only the new ids, read after the last few ids before them, and appends their
text to the text of the ids before (``TextCheckpoint``). Re-decoding the whole answer every step
made detokenizing grow with the square of its length: a 4,000-token answer spent 45 s in it.
Where the few ids' text is not the start of their decode with the new ones, the whole answer is
decoded, as before: a byte-fallback decoder (SentencePiece) reads a run of byte ids as U+FFFD
each while the character at its end is incomplete, a run that may start before the few ids.
Such a step whose new ids are only bytes (each U+FFFD alone) sends nothing and completes no stop
string, whatever the whole decode reads: it is not decoded (a long CJK or emoji answer of byte
ids decoded the whole run again at each step between two whole characters).

Trailing U+FFFD means a UTF-8 character is still incomplete: the text before it is searched for
stop strings and may be sent, the incomplete character waits for its next bytes, and at the end it
is dropped, never sent as U+FFFD (as vLLM and the edge's llama.cpp backend do: the token ids keep
its bytes). The last ``max(len(stop)) - 1`` characters are held back, since they may begin a stop
string that must not reach the client.

The engine gives it the tokenizer's decode of ids as they read after the prompt
(``HFTokenizer.decode_continuation``): a SentencePiece decoder strips the leading space of a text's
start only, so an answer's first token "▁Paris" is " Paris" (prompt + text is the decode of prompt
+ answer, as vLLM decodes with the prompt's tokens before the answer's); decoded alone, "Paris".
"""

from __future__ import annotations

from collections.abc import Callable

from .text_checkpoint import TextCheckpoint


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[list[int]], str], stop: list[str]) -> None:
        self._decode = decode
        self._stop = list(stop)
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._emitted = 0  # characters already sent
        self._text = ""
        self._unread: list[int] | None = None  # the last update's ids, where it skipped decoding
        self.stopped = False
        self._checkpoint = TextCheckpoint(decode)
        # a stop string with U+FFFD could match the U+FFFDs of a byte run: those steps decode
        self._may_skip = not any("\ufffd" in s for s in stop)

    @property
    def num_sent_chars(self) -> int:
        """Characters of ``text`` already handed out."""
        return self._emitted

    @property
    def text(self) -> str:
        """The text so far (an incomplete character at its end left out, cut at a stop string)."""
        if self._unread is not None:  # decoded when asked (the engine only sends the deltas)
            self._text, self._unread = self._complete(self._decode(list(self._unread))), None
        return self._text

    def _decode_all(self, output_ids: list[int], *, final: bool) -> str | None:
        """The decode of ``output_ids`` (the whole output so far, extending the ids of earlier
        updates), from the checkpoint where it reads the same. None (not decoded) where the ids
        after the checkpoint are only bytes, before the end: the checkpoint's text was sent or
        held back and searched for stops already, and past it (or from its byte run's start,
        a run the bytes turn invalid) the whole decode reads U+FFFD only, which is not sent
        before the end and completes no stop string."""
        n = len(output_ids)
        text = self._checkpoint.read(output_ids, n)
        if text is not None:
            return text
        skip = self._may_skip and not final and not self.stopped
        if skip and self._checkpoint.only_bytes_after(output_ids, n):
            return None
        return self._decode(list(output_ids))

    def _complete(self, text: str) -> str:
        # an incomplete character at the end (a U+FFFD already sent stays: it was mid-text)
        return text[: max(self._emitted, len(text.rstrip("\ufffd")))]

    def _stop_hits(self, text: str) -> list[int]:
        start = max(0, self._emitted - self._hold)  # earlier text was searched already
        return [i for i in (text.find(s, start) for s in self._stop) if i >= 0]

    def finds_stop(self, output_ids: list[int]) -> bool:
        """Whether ``output_ids`` complete a stop string (a look only: nothing changes)."""
        if not self._stop:
            return False
        raw = self._decode_all(output_ids, final=False)
        return raw is not None and bool(self._stop_hits(self._complete(raw)))

    def update(self, output_ids: list[int], *, final: bool = False) -> str:
        """Decode ``output_ids`` (the earlier update's ids and the new ones); returns the new
        text that is safe to send."""
        raw = self._decode_all(output_ids, final=final)
        self._unread = None if raw is not None else list(output_ids)
        if raw is None:  # only bytes after the checkpoint: nothing to send yet
            return ""
        self._checkpoint.advance(output_ids, len(output_ids), raw)
        text = self._complete(raw)
        if self._stop:
            hits = self._stop_hits(text)
            if hits:
                text = text[: min(hits)]
                self.stopped = final = True
        self._text = text
        end = len(text) if final else max(self._emitted, len(text) - self._hold)
        delta = text[self._emitted : end]
        self._emitted = end
        return delta
