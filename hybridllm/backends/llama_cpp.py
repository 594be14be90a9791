"""The on-device backend on llama.cpp (llama-cpp-python).

We drive ``Llama.generate`` (the token loop) ourselves rather than ``create_chat_completion``: it
gives exact token counts, per-token log-probabilities for the cascade, stop strings that never leak
a partial match, and a generator that stops the moment the caller stops reading.
"""

from __future__ import annotations

import codecs
import os
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .._config import DEFAULT_EDGE_MODEL
from .._exceptions import EdgeBusyError, EdgeError, ModelCorruptError
from .._types import GenerationParams, Messages, Usage
from ..models.store import Progress, resolve_gguf
from ..prompts import PromptFormat, llama_plain, tokenize_prompt
from .base import Delta, DeviceBackend, register_backend

DEFAULT_MODEL = DEFAULT_EDGE_MODEL


class StopMatcher:
    """Holds back text that may be the start of a stop string; cuts at the first full match."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was hit)."""
        buf = self.pending + text
        if not self.stops:
            self.pending = ""
            return buf, False
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.pending = ""
            return buf[:cut], True
        hold = 0
        for stop in self.stops:  # longest suffix of buf that is a proper prefix of a stop
            for k in range(min(len(stop) - 1, len(buf)), hold, -1):
                if buf.endswith(stop[:k]):
                    hold = k
                    break
        self.pending = buf[len(buf) - hold:] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class LlamaCppBackend(DeviceBackend):
    """Chat and completion on a GGUF model with llama.cpp on the CPU (or its GPU build)."""

    name = "llama_cpp"

    def __init__(
        self,
        model: str | os.PathLike[str] = DEFAULT_MODEL,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_batch: int = 512,
        chat_format: str | None = None,  # "template", "completion" or None (from the model)
        system_prompt: str | None = None,  # used when a conversation has none; "" = never
        progress: Progress | None = None,
        verbose: bool = False,
    ) -> None:
        self.model, self.model_path, spec = resolve_gguf(model, progress=progress)
        self.n_threads = n_threads or os.cpu_count() or 1
        self._busy = threading.Lock()  # a flag: never waited on
        try:
            from llama_cpp import Llama
        except ImportError as exc:  # pragma: no cover - a broken install
            raise EdgeError(
                "llama-cpp-python is not installed: pip install llama-cpp-python"
            ) from exc
        try:
            self._llm: Any = Llama(
                model_path=str(self.model_path), n_ctx=n_ctx, n_threads=self.n_threads,
                n_threads_batch=self.n_threads, n_batch=n_batch, verbose=verbose,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelCorruptError(
                f"llama.cpp could not load {self.model_path} ({exc}). The file is truncated, "
                "corrupt or of an unsupported architecture: "
                + (f"re-pull it with `hybridllm models pull {spec.id} --force`, " if spec else "")
                + "or pass another .gguf file."
            ) from exc
        meta = self._llm.metadata
        self._template = meta.get("tokenizer.chat_template")
        if chat_format is None:
            chat_format = spec.chat_format if spec else ("template" if self._template else "completion")
        if chat_format == "template" and not self._template:
            raise ModelCorruptError(
                f"{self.model_path} has no chat template; use chat_format='completion'."
            )
        self.chat_format = chat_format
        # the catalog may name a default system prompt (see hybridllm.prompts)
        if system_prompt is None and spec is not None:
            system_prompt = spec.extra.get("system_prompt")
        self.system_prompt = system_prompt or None
        self._n_vocab = self._llm.n_vocab()
        self._plain: tuple[dict[str, int], Callable[[str], list[int]]] | None = None
        self.prompt_format = PromptFormat(
            chat_template=self._template if chat_format == "template" else None,
            bos_token=self._piece(self._llm.token_bos()),
            eos_token=self._piece(self._llm.token_eos()), system_prompt=self.system_prompt)

    def _piece(self, token: int) -> str:
        if token < 0:
            return ""
        return bytes(self._llm.detokenize([token], special=True)).decode("utf-8", errors="ignore")

    @property
    def context_length(self) -> int:
        # llama.cpp pads its context to a multiple of 256, but llama-cpp-python keeps the tokens in
        # a buffer of the size asked for: a prompt past that size failed inside eval (a numpy
        # ValueError) instead of being refused, and a generation ran past it
        asked = int(self._llm.context_params.n_ctx)
        padded = int(self._llm.n_ctx())
        return min(asked, padded) if asked > 0 else padded

    def tokenize(self, messages: Messages, *, prefix: str = "") -> list[int]:
        # only the template's own markers become control tokens; every message's text and the
        # prefix are read as plain text, added markers such as <tool_call> too
        # (hybridllm.prompts.tokenize_prompt, llama_plain)
        if self._plain is None:  # one pass over the vocabulary, on first use
            self._plain = llama_plain(self._llm)
        special_ids, encode_plain = self._plain
        ids = tokenize_prompt(self.prompt_format, messages, prefix=prefix,
                              special_ids=special_ids, encode_plain=encode_plain)
        # what llama.cpp's add_special puts first for this model (BOS or nothing), unless the
        # template wrote it already
        start = list(self._llm.tokenize(b"", add_bos=True, special=False))
        if start and ids[: len(start)] != start:
            ids[:0] = start
        return ids

    def _run(self, tokens: list[int], params: GenerationParams,
             stops: tuple[str, ...]) -> Iterator[Delta]:
        # one llama.cpp context runs one generation at a time. HybridLLM queues requests on one
        # thread (backends/worker.py); a direct caller overlapping two streams gets a clear
        # error at once instead of a lock that a reader holds while it reads
        if not self._busy.acquire(blocking=False):
            raise EdgeBusyError(
                "This LlamaCppBackend is already generating; one stream at a time. Use HybridLLM "
                "(which queues requests) or close the other stream first.")
        try:
            yield from self._generate(tokens, params, stops)
        finally:
            self._busy.release()

    def _generate(self, tokens: list[int], params: GenerationParams,
                  stops: tuple[str, ...]) -> Iterator[Delta]:
        import numpy as np
        from llama_cpp import llama_cpp as C

        llm = self._llm
        # llama.cpp takes a 32-bit seed and reads 0xFFFFFFFF (what -1 wraps to) as "draw a random
        # one": folding modulo 2**32 - 1 keeps every seed, -1 included, repeatable as on ONNX
        seed = params.seed % (2**32 - 1) if params.seed is not None else random.randrange(2**31)
        llm.set_seed(seed)
        budget = min(params.max_tokens, self.context_length - len(tokens))
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        matcher = StopMatcher(stops)
        n_out, finish = 0, "length"
        gen = llm.generate(
            tokens, temp=params.temperature, top_p=params.top_p, top_k=params.top_k,
            min_p=params.min_p, repeat_penalty=params.repeat_penalty, reset=True,
        )
        try:
            for token in gen:
                if C.llama_vocab_is_eog(llm._model.vocab, token):
                    finish = "stop"
                    break
                n_out += 1
                logprob = None
                if params.logprobs:
                    # [n_vocab] logits of the position that produced `token`
                    row = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(self._n_vocab,))
                    peak = float(row.max())
                    logprob = float(row[token] - peak - np.log(np.exp(row - peak).sum()))
                text, hit = matcher.feed(decoder.decode(bytes(llm.detokenize([token]))))
                if text or logprob is not None:
                    yield Delta(text, logprob=logprob)
                if hit:
                    finish = "stop"
                    break
                if n_out >= budget:
                    break
        except (RuntimeError, OSError) as exc:
            raise EdgeError(f"llama.cpp failed while generating: {exc}") from exc
        finally:
            gen.close()  # stops decoding at once when the caller breaks out
        # the bytes of a character cut by max_tokens (or by the end of the answer) are dropped, never
        # sent as U+FFFD, so the deltas join to the final text as the characters they are; text held
        # back as the start of a stop string that never came is the answer's own (after a stop
        # string, nothing is held)
        tail = matcher.flush()
        yield Delta(tail, finish_reason=finish, usage=Usage(len(tokens), n_out))

    def close(self) -> None:
        llm = getattr(self, "_llm", None)
        if llm is not None:
            llm.close()
            self._llm = None


def _factory(**kwargs: Any) -> LlamaCppBackend:
    return LlamaCppBackend(**kwargs)


register_backend("llama_cpp", _factory)

__all__ = ["DEFAULT_MODEL", "LlamaCppBackend", "StopMatcher"]
