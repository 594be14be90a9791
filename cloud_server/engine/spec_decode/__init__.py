"""Speculative decoding: cheap proposals for the next k tokens, verified in one target step.

``ngram.py`` proposes by prompt lookup, ``draft.py`` with a smaller model sharing the tokenizer,
``rejection.py`` decides which proposals the target accepts (lossless), and ``decoder.py`` ties
them to the engine's step: how many lookahead slots each sequence gets (the adaptive rule), the
proposals, the verification and the counters behind ``/metrics``.
"""

from .decoder import SpecDecoder, SpecStats

__all__ = ["SpecDecoder", "SpecStats"]
