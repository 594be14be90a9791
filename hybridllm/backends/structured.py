"""Structured output (``response_format``) on the device backends: every sampled token is held to
the format's grammar by the core's byte-level matcher (:mod:`hybridllm._structured`).

Each backend keeps one :class:`DeviceFormats`: the model's token index (the core's ``TokenIndex``),
built once, at the first structured request (a second or so on a large vocabulary); the grammars
are the library's (``hybridllm._types.grammar_of``, memoised by the format). A request without a
``response_format`` never reaches any of it.

Why our own mask rather than llama.cpp's GBNF: one schema subset, one set of errors and the same
output rules on every route (llama.cpp, ONNX Runtime, the cloud server).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .._exceptions import EdgeError
from .._types import grammar_of

Vocabulary = Callable[[], tuple[Sequence[bytes | None], Iterable[int]]]


def response_format_of(params: Any) -> dict[str, Any] | None:
    """The request's ``response_format`` (None: unconstrained)."""
    return getattr(params, "response_format", None) or None


def constrained(params: Any) -> bool:
    """The answer is held to a grammar: a ``response_format``, or tools: a forced call
    (``tool_choice`` "required" or a named function: the call's form and its arguments' schema)
    or the calls an auto answer makes (each held to its tool's schema once it begins)."""
    from .._tool_plan import plan_of

    return response_format_of(params) is not None or plan_of(params) is not None


class DeviceFormats:
    """One model's token index. ``vocabulary()`` gives (the bytes each token id adds to
    the answer, None for one that adds none or must never be drawn; the end-of-generation ids)."""

    def __init__(self, vocabulary: Vocabulary) -> None:
        self._vocabulary = vocabulary
        self._lock = threading.Lock()
        self._index: Any = None
        self._local = threading.local()  # .prefix: a continuation's text, while its run is made

    def index(self) -> Any:
        """The model's token index, built on first use (once, whichever thread asks first)."""
        with self._lock:
            if self._index is None:
                from .._structured import TokenIndex

                token_bytes, eos_ids = self._vocabulary()
                self._index = TokenIndex(token_bytes, eos_ids)
            return self._index

    def forget(self) -> None:
        """Drop the index (its memoised masks too) when the model is closed."""
        with self._lock:
            self._index = None

    @contextmanager
    def continuing(self, prefix: str) -> Iterator[None]:
        """While a continuation's run is made on this thread, the answer starts with ``prefix``."""
        self._local.prefix = prefix
        try:
            yield
        finally:
            self._local.prefix = ""

    def start(self, params: Any) -> Constraint | None:
        """The constraint for one request (None when it has no ``response_format``), its matcher
        already past a continuation's prefix. Parses now, so a bad format fails before any model
        step; the token index is built later, by :meth:`Constraint.bind`."""
        from .._tool_plan import plan_of

        plan, value = plan_of(params), response_format_of(params)
        if plan is not None:  # a forced call (its form and its schema), or an auto answer's calls
            grammar = plan.grammar()  # (memoised by the core, as a format's; auto: None if unservable)
        elif value is None:
            return None
        else:
            grammar = grammar_of(value)  # the request's own (memoised; a bad one: InvalidRequestError)
        if grammar is None:
            return None
        matcher = grammar.matcher()
        prefix = getattr(self._local, "prefix", "")
        if prefix and not matcher.feed(prefix.encode("utf-8")):
            raise EdgeError(
                "The answer to continue does not fit the request's response_format (its text so "
                "far is not the start of a value the format allows), so the device cannot continue "
                "it. Retry the request.")
        return Constraint(self, matcher, grammar)


class Constraint:
    """One answer's matcher and the masks it allows, step by step."""

    def __init__(self, formats: DeviceFormats, matcher: Any, grammar: Any = None) -> None:
        self._formats = formats
        self.matcher = matcher
        self.grammar = grammar
        self.index: Any = None
        self.error: BaseException | None = None  # raised inside a native callback, re-raised after

    def bind(self) -> None:
        """Fetch (or build, on the model's first structured request) the token index, ready for
        the grammar's patterns (a pass over the vocabulary each, the first time: before the first
        token rather than inside a step)."""
        if self.index is None:
            self.index = self._formats.index()
            if self.grammar is not None:
                self.index.prepare(self.grammar)

    @property
    def finished(self) -> bool:
        """The value is complete and nothing may follow it: the answer ends here."""
        return bool(self.matcher.finished)

    @property
    def free(self) -> bool:
        """Nothing is held now (an auto answer's text between its calls): no mask to apply."""
        return bool(self.matcher.free)

    def allowed(self, vocab_size: int) -> Any:
        """[vocab_size] bools: the tokens that may come next (None while ``free``)."""
        if self.free:
            return None
        mask = self.index.allowed(self.matcher)
        if mask.shape[0] != vocab_size:
            raise EdgeError(
                f"The model's logits cover {vocab_size} tokens and its vocabulary {mask.shape[0]}: "
                "response_format cannot be applied to this model.")
        return mask

    def feed(self, token: int) -> None:
        """Advance over a drawn token; one the mask refused is an error, never a broken answer."""
        if not self.index.feed_token(self.matcher, int(token)):
            raise EdgeError(
                f"The device sampler drew token {token}, which the response_format's grammar "
                "refuses; the answer is incomplete.")

    def logits_processor(self) -> Callable[[Any, Any], Any]:
        """A llama-cpp-python logits processor: disallowed tokens get -inf. It runs inside a native
        callback, where an exception would only be printed: one is kept in ``error`` (the row
        left as it is) and :meth:`check` raises it before the step's token is used."""
        import numpy as np

        def mask(_ids: Any, scores: Any) -> Any:
            try:
                allowed = self.allowed(scores.shape[0])
                if allowed is not None:
                    np.copyto(scores, -np.inf, where=~allowed)
            except BaseException as exc:  # noqa: BLE001 - carried out of the native callback
                self.error = exc
            return scores

        return mask

    def check(self) -> None:
        """Raise what the native callback caught, if anything."""
        if self.error is not None:
            error, self.error = self.error, None
            if isinstance(error, EdgeError):
                raise error
            raise EdgeError(
                f"response_format could not be applied ({type(error).__name__}: {error}).") from error


def llama_vocabulary(llm: Any) -> tuple[list[bytes | None], set[int]]:
    """(each token's bytes as the answer shows it, the end-of-generation ids) of a
    ``llama_cpp.Llama``. Control, unknown and unused tokens, the end-of-generation ones and any
    whose text is empty add nothing to an answer: None (never drawn, or only as the end)."""
    from llama_cpp import llama_cpp as C

    from ..prompts import llama_bytes

    vocab = llm._model.vocab
    never = C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_UNKNOWN | C.LLAMA_TOKEN_ATTR_UNUSED
    out: list[bytes | None] = []
    eos: set[int] = set()
    for tid in range(llm.n_vocab()):
        if C.llama_vocab_is_eog(vocab, tid):
            eos.add(tid)
            out.append(None)
            continue
        if C.llama_vocab_get_attr(vocab, tid) & never:
            out.append(None)
            continue
        # the bytes the backend's own loop adds for this token (llama_bytes, special=False)
        piece = llama_bytes(llm, [tid])
        out.append(piece or None)
    return out, eos


def tokenizers_vocabulary(path: Any, vocab_size: int,
                          eos_ids: Iterable[int]) -> tuple[list[bytes | None], set[int]]:
    """The same for a Hugging Face ``tokenizer.json``, padded with None to ``vocab_size`` (a
    model head wider than its tokenizer); the end ids add nothing either."""
    from tokenizers import Tokenizer

    from .._structured import token_bytes_from_tokenizer

    token_bytes: list[bytes | None] = list(token_bytes_from_tokenizer(Tokenizer.from_file(str(path))))
    if len(token_bytes) < vocab_size:
        token_bytes += [None] * (vocab_size - len(token_bytes))
    eos = {int(t) for t in eos_ids if 0 <= int(t) < len(token_bytes)}
    for tid in eos:
        token_bytes[tid] = None
    return [b or None for b in token_bytes], eos
