"""Incremental detokenization with stop strings.

Each step decodes only the new ids, read after the last few ids before them (``_CONTEXT``), and
appends their text to the text of the ids before (a checkpoint that ends with a whole character).
Re-decoding the whole answer every step made detokenizing grow with the square of its length: a
4,000-token answer spent 45 s in it, 10 ms a token at its end, more than the model's own step.
Where the few ids' text is not the start of their decode with the new ones, the whole answer is
decoded, as before: a byte-fallback decoder (SentencePiece) reads a run of byte ids as U+FFFD
each while the character at its end is incomplete, a run that may start before the few ids.

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

# ids decoded again before the new ones each step, so the decoder reads them mid-text (a
# SentencePiece word's space, the bytes of a character split over tokens) as in the whole answer
_CONTEXT = 6


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[list[int]], str], stop: list[str]) -> None:
        self._decode = decode
        self._stop = list(stop)
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._emitted = 0  # characters already sent
        self.text = ""
        self.stopped = False
        # checkpoint: the text of the first ``_done`` ids (it ends with a whole character), and
        # the last ids before it with their own decode, the context of the next decodes
        self._done = 0
        self._done_text = ""
        self._ctx_ids: list[int] = []
        self._ctx_text = ""

    @property
    def num_sent_chars(self) -> int:
        """Characters of ``text`` already handed out."""
        return self._emitted

    def _decode_all(self, output_ids: list[int]) -> str:
        """The decode of ``output_ids`` (the whole output so far, extending the ids of earlier
        updates): the checkpoint's text, then the new ids' text as read after its context."""
        start = self._done - len(self._ctx_ids)
        if self._done and len(output_ids) >= self._done and output_ids[start : self._done] == self._ctx_ids:
            tail = self._decode(output_ids[start:])
            if tail.startswith(self._ctx_text):
                return self._done_text + tail[len(self._ctx_text) :]
        return self._decode(list(output_ids))

    def _advance(self, output_ids: list[int], text: str) -> None:
        """Move the checkpoint to the end of ``output_ids`` when their text ends with a whole
        character (an incomplete one may still change with the next ids) and their last ids read
        alone as they do in it: a byte-fallback decoder reads a run of byte ids as one, so ids
        from the middle of a run of CJK characters read as U+FFFD each; such a context is
        skipped, the checkpoint stays where it was."""
        if len(output_ids) <= self._done or text.endswith("\ufffd"):
            return
        ctx_ids = list(output_ids[max(0, len(output_ids) - _CONTEXT) :])
        ctx_text = self._decode(ctx_ids)
        if not text.endswith(ctx_text):
            return
        self._ctx_ids, self._ctx_text = ctx_ids, ctx_text
        self._done, self._done_text = len(output_ids), text

    def _complete(self, text: str) -> str:
        # an incomplete character at the end (a U+FFFD already sent stays: it was mid-text)
        return text[: max(self._emitted, len(text.rstrip("\ufffd")))]

    def _stop_hits(self, text: str) -> list[int]:
        start = max(0, self._emitted - self._hold)  # earlier text was searched already
        return [i for i in (text.find(s, start) for s in self._stop) if i >= 0]

    def finds_stop(self, output_ids: list[int]) -> bool:
        """Whether ``output_ids`` complete a stop string (a look only: nothing changes)."""
        return bool(self._stop) and bool(self._stop_hits(self._complete(self._decode_all(output_ids))))

    def update(self, output_ids: list[int], *, final: bool = False) -> str:
        """Decode ``output_ids`` (the earlier update's ids and the new ones); returns the new
        text that is safe to send."""
        raw = self._decode_all(output_ids)
        self._advance(output_ids, raw)
        text = self._complete(raw)
        if self._stop:
            hits = self._stop_hits(text)
            if hits:
                text = text[: min(hits)]
                self.stopped = final = True
        self.text = text
        end = len(text) if final else max(self._emitted, len(text) - self._hold)
        delta = text[self._emitted : end]
        self._emitted = end
        return delta
