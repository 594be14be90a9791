"""Incremental detokenization with stop strings.

Text is re-decoded from all output ids each step (exact for every tokenizer, cheap at these
lengths). A trailing U+FFFD means a UTF-8 character is still incomplete, so nothing is emitted yet;
the last ``max(len(stop)) - 1`` characters are held back, since they may begin a stop string that
must not reach the client.
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

    def update(self, output_ids: list[int], *, final: bool = False) -> str:
        """Decode ``output_ids``; returns the new text that is safe to send."""
        text = self._decode(output_ids)
        if not final and text.endswith("\ufffd"):
            return ""
        if self._stop:
            start = max(0, self._emitted - self._hold)
            hits = [i for i in (text.find(s, start) for s in self._stop) if i >= 0]
            if hits:
                text = text[: min(hits)]
                self.stopped = final = True
        self.text = text
        end = len(text) if final else max(self._emitted, len(text) - self._hold)
        delta = text[self._emitted : end]
        self._emitted = end
        return delta
