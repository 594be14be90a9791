"""The ONNX encoder base shared by the sentence embedder and the cache reranker (run time only).

A prepared folder (:mod:`.prepare`) holds the int8 and fp32 ONNX graphs and ``tokenizer.json``;
this loads one graph into an ONNX Runtime CPU session with the tokenizer and pads batches. Needs
only ``onnxruntime``, ``tokenizers`` and numpy.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import ModelError
from ..prompts import valid_text
from .prepare import FP32_NAME, INT8_NAME, TOKENIZER_NAME

# texts (long or not ASCII) whose check the latest runs answered: the cache asks about its query
# right after embedding it, and a request's texts are few at a time (see ``OnnxEncoder.fits``)
FIT_MEMO_SIZE = 16
# characters the BERT normalizer deletes without an [UNK] though they stand for something: private
# use (icon-font glyphs, the Apple logo), U+FFFD and half an emoji (which ``valid_text`` makes U+FFFD).
# Other deleted characters (controls, zero-width marks) change no meaning; unassigned ones read as
# [UNK], which the check sees
_DROPPED = re.compile("[\ue000-\uf8ff\U000f0000-\U0010ffff\ufffd\ud800-\udfff]")


def cpu_session(ort: Any, path: Path, num_threads: int | None) -> Any:
    """An ONNX Runtime CPU session tuned for one short input at a time.

    One thread by default: a cache lookup embeds one short question, where a second thread adds
    synchronization and, on a busy device, spin-waiting (measured on 2 loaded cores: p50 3.3 ms
    with one thread, 11 ms with two). Batch jobs may ask for more.
    """
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = num_threads or 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # errors only: ONNX Runtime's graph notes are not for the user
    if opts.intra_op_num_threads > 1:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def pad_batch(encodings: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids, attention mask and token types of tokenizer encodings, right-padded with zeros to
    the longest: three ``[batch, seq]`` int64 arrays (the graph's inputs; the trainer's too)."""
    width = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(encodings), width), dtype=np.int64)  # [batch, seq]
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for row, enc in enumerate(encodings):
        n = len(enc.ids)
        ids[row, :n] = enc.ids
        mask[row, :n] = 1
        types[row, :n] = enc.type_ids
    return ids, mask, types


class OnnxEncoder:
    """An ONNX Runtime session on ``folder``'s graph and its tokenizer (thread-safe: sessions allow
    concurrent ``run`` calls and the tokenizer is only read after construction)."""

    what = "encoder"  # for messages

    def __init__(self, folder: Path, *, quantized: bool, num_threads: int | None, max_tokens: int) -> None:
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ModelError(f"The {self.what} needs onnxruntime and tokenizers: {exc}") from exc
        self.path = folder / (INT8_NAME if quantized else FP32_NAME)
        loading = self.path
        try:
            self._session: Any = cpu_session(ort, self.path, num_threads)
            loading = folder / TOKENIZER_NAME
            tokenizer = Tokenizer.from_file(str(loading))
        except Exception as exc:  # a truncated or foreign file: name it (the tokenizer's error does not)
            raise ModelError(
                f"Cannot load the {self.what} file {loading} ({exc}); delete the folder {folder} and "
                "run `hybridllm models prepare minilm-l6-v2`."
            ) from exc
        tokenizer.no_padding()  # each batch is padded to its own longest input in run()
        tokenizer.enable_truncation(max_tokens)  # pairs: longest-first across the two texts
        self._tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.quantized = quantized
        # a word piece covers one normalized character at the least, and normalizing turns a
        # character into at most three (a Hangul syllable splits into its three jamo: 126 Korean
        # characters can fill 256 tokens): a text this short always fits, without tokenizing it,
        # when it is ASCII too (every ASCII character has a word piece: never an [UNK])
        self._always_fits = (max_tokens - 2) // 3
        self._unk_id = tokenizer.token_to_id("[UNK]")
        self._fit_memo: dict[str, bool] = {}  # text checked -> read whole, from its last run
        self._memo_lock = threading.Lock()

    def encode(self, inputs: Sequence[str] | Sequence[tuple[str, str]]) -> list[Any]:
        """Tokenizer encodings of texts or text pairs, cut to ``max_tokens`` (``overflowing`` says
        what was cut). Tokenize once, then feed :meth:`run_encoded` and read the length check."""
        # a direct caller may pass any str: half an emoji would make the tokenizer raise TypeError
        texts = [valid_text(x) if isinstance(x, str) else tuple(map(valid_text, x)) for x in inputs]
        return self._tokenizer.encode_batch(texts) if texts else []

    def fits(self, *texts: str) -> bool:
        """Whether the graph reads each of ``texts`` whole: the tokenizer cuts what is longer, and
        a character it has no word piece for (an emoji) reads as ``[UNK]``, so "Is this 🍄 edible?"
        and "Is this 🌿 edible?" are one input to the graph. A text run through the graph lately is
        answered from that run, not tokenized again."""
        longer = [t for t in texts if not self._surely_fits(t)]
        known = [self._fit_memo.get(t) for t in longer]
        if False in known:
            return False
        unknown = [t for t, k in zip(longer, known, strict=True) if k is None]
        return all(self._read_whole(t, e) for t, e in zip(unknown, self.encode(unknown), strict=True))

    def _surely_fits(self, text: str) -> bool:
        """A short ASCII text: read whole, known without tokenizing it."""
        return len(text) <= self._always_fits and text.isascii()

    def _read_whole(self, text: str, encoding: Any) -> bool:
        """Whether the graph saw all of ``text`` (``encoding`` its tokens): nothing cut, no
        ``[UNK]``, no character the normalizer deleted in silence (``_DROPPED``)."""
        return not encoding.overflowing and self._unk_id not in encoding.ids and not _DROPPED.search(text)

    def fits_pairs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """``[n]`` bool: whether the graph reads each pair whole (as :meth:`fits` a text)."""
        encodings = self.encode(pairs)
        whole = [self.pair_read_whole(p, e) for p, e in zip(pairs, encodings, strict=True)]
        return np.array(whole, dtype=bool)

    def pair_read_whole(self, pair: tuple[str, str], encoding: Any) -> bool:
        """Whether the graph saw all of both texts of ``pair`` (``encoding`` its tokens): as
        :meth:`_read_whole`. A length check alone let "Is this 🍄 edible?" and "Is this 🌿 edible?"
        through: one ``[UNK]`` each, so the reranker read two equal questions and said "same"."""
        return self._read_whole("".join(pair), encoding)

    def run(self, inputs: Sequence[str] | Sequence[tuple[str, str]]) -> np.ndarray:
        """The graph's output for one batch of texts or text pairs."""
        encodings = self.encode(inputs)
        self._remember(inputs, encodings)
        return self.run_encoded(encodings)

    def run_encoded(self, encodings: Sequence[Any]) -> np.ndarray:
        """The graph's output for one batch of :meth:`encode`'s encodings, padded together."""
        ids, mask, types = pad_batch(encodings)
        (out,) = self._session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        return np.asarray(out, dtype=np.float32)

    def _remember(self, inputs: Sequence[Any], encodings: Sequence[Any]) -> None:
        """Keep whether each text of a run that :meth:`fits` would tokenize was read whole (the
        latest ``FIT_MEMO_SIZE``; an answer never goes stale: it depends on the text only)."""
        seen = [
            (text, self._read_whole(text, enc))
            for text, enc in zip(inputs, encodings, strict=True)
            if isinstance(text, str) and not self._surely_fits(text)
        ]
        if not seen:
            return
        with self._memo_lock:
            for text, whole in seen:
                self._fit_memo.pop(text, None)  # re-inserted last: the newest stay
                self._fit_memo[text] = whole
            while len(self._fit_memo) > FIT_MEMO_SIZE:
                del self._fit_memo[next(iter(self._fit_memo))]
