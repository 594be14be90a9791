"""Incremental detokenization with stop strings.

Text is re-decoded from all output ids each step (exact for every tokenizer, cheap at these
lengths). Trailing U+FFFD means a UTF-8 character is still incomplete: the text before it is
searched for stop strings and may be sent, the incomplete character waits for its next bytes, and
at the end it is dropped, never sent as U+FFFD (as vLLM and the edge's llama.cpp backend do: the
token ids keep its bytes). The last ``max(len(stop)) - 1`` characters are held back, since they may
begin a stop string that must not reach the client.

The engine gives it the tokenizer's decode of ids as they read after the prompt
(``HFTokenizer.decode_continuation``): a SentencePiece decoder strips the leading space of a text's
start only, so an answer's first token "▁Paris" is " Paris" (prompt + text is the decode of prompt
+ answer, as vLLM decodes with the prompt's tokens before the answer's); decoded alone, "Paris".
"""

from __future__ import annotations

from collections.abc import Callable


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[list[int]], str], stop: list[str]) -> None:
        self._decode = decode
        self._stop = list(stop)
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._emitted = 0  # characters already sent
        self.text = ""
        self.stopped = False

    @property
    def num_sent_chars(self) -> int:
        """Characters of ``text`` already handed out."""
        return self._emitted

    def _complete(self, output_ids: list[int]) -> str:
        text = self._decode(output_ids)
        # an incomplete character at the end (a U+FFFD already sent stays: it was mid-text)
        return text[: max(self._emitted, len(text.rstrip("\ufffd")))]

    def _stop_hits(self, text: str) -> list[int]:
        start = max(0, self._emitted - self._hold)  # earlier text was searched already
        return [i for i in (text.find(s, start) for s in self._stop) if i >= 0]

    def finds_stop(self, output_ids: list[int]) -> bool:
        """Whether ``output_ids`` complete a stop string (a look only: nothing changes)."""
        return bool(self._stop) and bool(self._stop_hits(self._complete(output_ids)))

    def update(self, output_ids: list[int], *, final: bool = False) -> str:
        """Decode ``output_ids``; returns the new text that is safe to send."""
        text = self._complete(output_ids)
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
