"""The on-device backend on llama.cpp (llama-cpp-python).

We drive ``Llama.generate`` (the token loop) ourselves rather than ``create_chat_completion``: it
gives exact token counts, per-token log-probabilities for the cascade, stop strings that never leak
a partial match, and a generator that stops the moment the caller stops reading.
"""

from __future__ import annotations

import codecs
import logging
import os
import random
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .._config import DEFAULT_EDGE_MODEL
from .._cpus import usable_cpus
from .._exceptions import ConfigError, EdgeBusyError, EdgeError, HybridLLMError, ModelCorruptError
from .._types import GenerationParams, Messages, Usage
from ..models.store import Progress, resolve_gguf
from ..prompts import PromptFormat, llama_bytes, llama_plain, tokenize_prompt
from ._llama_cpp_gate import _CLOSED, _CLOSED_MID_ANSWER, _OPEN, _Gate  # tests read llama_cpp._Gate
from ._llama_cpp_steps import _check_finite, _prefill_head  # looked up here: tests patch them here
from .base import (
    _MAX_THREADS,  # the command line's --threads check reads it here too
    Delta,
    DeviceBackend,
    StopMatcher,
    check_device_settings,
    register_backend,
    return_freed_memory,
)
from .cancel import stop_requested
from .llama_cpp_load import (
    _llama_version,
    _repull_hint,
    _route_llama_logs,
    _trained_context,
    load_reasons,
)
from .structured import Constraint, DeviceFormats, constrained, llama_vocabulary

DEFAULT_MODEL = DEFAULT_EDGE_MODEL
log = logging.getLogger("hybridllm.edge")

# llama.cpp's CPU backend runs a decode's threads in an OpenMP pool (libgomp), made at the first
# decode with more than one thread. A fork copies the pool's bookkeeping but not its threads, so a
# multi-threaded decode in the child waits for them for ever; one thread never uses the pool.
_POOL_PID: int | None = None  # the process whose decodes made the pool (a fork inherits the value)


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
        check_device_settings(n_ctx, n_threads, n_batch)
        if chat_format not in (None, "template", "completion"):
            # llama-cpp-python's own names ("chatml", "llama-2") are not ours: one passed here
            # silently became the plain completion transcript, a prompt the model was not tuned on
            raise ConfigError(
                f"chat_format must be 'template' (the model's own chat template), 'completion' or "
                f"None (from the model), got {chat_format!r}.")
        self.model, self.model_path, spec = resolve_gguf(model, progress=progress)
        self.n_threads = n_threads or min(usable_cpus(), _MAX_THREADS)
        self._busy = threading.Lock()  # a flag: never waited on
        self._gate = _Gate()
        try:
            from llama_cpp import Llama
        except ImportError as exc:  # pragma: no cover - a broken install
            raise EdgeError(
                "llama-cpp-python is not installed: pip install llama-cpp-python"
            ) from exc
        _route_llama_logs()

        def load(n_ctx: int) -> Any:
            return Llama(
                model_path=str(self.model_path), n_ctx=n_ctx, n_threads=self.n_threads,
                # a batch longer than the context never runs, but llama-cpp-python sizes its logits
                # buffer by it (n_batch x vocabulary floats): n_batch=10**9 raised a MemoryError
                n_threads_batch=self.n_threads, n_batch=min(n_batch, n_ctx or n_batch), verbose=verbose,
            )

        trained = _trained_context(self.model_path) or 0
        if trained > 0 and n_ctx > trained:
            # llama.cpp only logs it, and answers past the trained length fall apart, while the
            # router would send prompts up to n_ctx here: the context is made at the model's own
            # length (the default 4096 is more than some GGUFs were trained on: not an error)
            log.warning("n_ctx=%d is more than %s was trained on (%d tokens); its context is %d",
                        n_ctx, self.model, trained, trained)
            n_ctx = trained
        with load_reasons() as reasons:
            try:
                self._llm: Any = load(n_ctx)
            except (ValueError, RuntimeError, OSError, MemoryError) as exc:
                # the model loaded, then its context (KV cache), batch or logits could not be made
                if isinstance(exc, MemoryError) or "llama_context" in str(exc) or "llama_batch" in str(exc):
                    raise ConfigError(
                        f"llama.cpp loaded {self.model_path} but could not make a context of n_ctx="
                        f"{n_ctx} tokens with n_batch={n_batch} ({exc}): too little memory for its KV "
                        "cache, or values this model does not allow. Lower n_ctx (0: the model's own)."
                    ) from exc
                # llama-cpp-python's own message is only "Failed to load model from file": llama.cpp
                # said why in its log. A model of an architecture this llama.cpp does not know is
                # whole: downloading it again (the advice for a damaged file) cannot help. A name
                # that is empty or not plain ASCII (llama.cpp's are letters, digits, '-', '_', '.')
                # is no architecture: a damaged header (a flipped byte in the key
                # general.architecture or in its value), which was blamed on this llama.cpp, with
                # no re-pull advice
                why = reasons[-1] if reasons else str(exc)
                if re.search(r"unknown model architecture: '[A-Za-z0-9_.\-]+'", why):
                    raise ModelCorruptError(
                        f"llama.cpp could not load {self.model_path} ({why}): this llama.cpp "
                        f"(llama-cpp-python {_llama_version()}) cannot run models of that architecture. "
                        "Pass a GGUF of a supported one, or a catalog id (`hybridllm models list`)."
                    ) from exc
                raise ModelCorruptError(
                    f"llama.cpp could not load {self.model_path} ({why}). The file is truncated, "
                    f"corrupt or of an unsupported architecture. {_repull_hint(self.model_path, spec)}"
                ) from exc
        trained = int(self._llm._model.n_ctx_train())
        if trained > 0 and n_ctx > trained:  # a header the reader above could not read
            log.warning("n_ctx=%d is more than %s was trained on (%d tokens); its context is %d",
                        n_ctx, self.model, trained, trained)
            self._llm.close()
            self._llm = load(trained)
        meta = self._llm.metadata
        if getattr(self._llm._ctx, "memory", True) is None:
            # an encoder-only model (BERT, an embedding GGUF) loads, but llama.cpp makes it no KV
            # cache: its first answer failed with llama-cpp-python's bare AssertionError
            self._llm.close()
            raise ModelCorruptError(
                f"{self.model_path} is an embedding model (architecture "
                f"{meta.get('general.architecture', '?')!r}), not one that generates text; pass a "
                "chat or completion GGUF, or a catalog id (`hybridllm models list`).")
        self._template = meta.get("tokenizer.chat_template")
        if chat_format is None:
            chat_format = spec.chat_format if spec else ("template" if self._template else "completion")
        if chat_format == "template" and not self._template:
            self._llm.close()  # the model and its KV cache are not kept by an error's traceback
            raise ModelCorruptError(
                f"{self.model_path} has no chat template; use chat_format='completion'."
            )
        self.chat_format = chat_format
        # the catalog may name a default system prompt (see hybridllm.prompts)
        if system_prompt is None and spec is not None:
            system_prompt = spec.extra.get("system_prompt")
        self.system_prompt = system_prompt or None
        self._n_vocab = self._llm.n_vocab()
        # llama.cpp pads its context to a multiple of 256, but llama-cpp-python keeps the tokens in
        # a buffer of the size asked for: a prompt past that size failed inside eval (a numpy
        # ValueError) instead of being refused, and a generation ran past it
        asked = int(self._llm.context_params.n_ctx)
        padded = int(self._llm.n_ctx())
        self._n_ctx = min(asked, padded) if asked > 0 else padded
        self._plain: tuple[dict[str, int], Callable[[str], list[int]]] | None = None
        # response_format: the token index, built at the first structured request
        self._formats = DeviceFormats(self._vocabulary)
        self.prompt_format = PromptFormat(
            chat_template=self._template if chat_format == "template" else None,
            bos_token=self._piece(self._llm.token_bos()),
            eos_token=self._piece(self._llm.token_eos()), system_prompt=self.system_prompt)
        _OPEN.add(self)

    def _piece(self, token: int) -> str:
        if token < 0:
            return ""
        return llama_bytes(self._llm, [token], special=True).decode("utf-8", errors="ignore")

    @property
    def context_length(self) -> int:
        if self._gate.closed:
            raise EdgeError(_CLOSED)
        return self._n_ctx

    def render(self, messages: Messages) -> str:
        if self._gate.closed:
            raise EdgeError(_CLOSED)
        return super().render(messages)

    def tokenize(self, messages: Messages, *, prefix: str = "",
                 tools: list[dict[str, Any]] | None = None) -> list[int]:
        # only the template's own markers become control tokens; every message's text and the
        # prefix are read as plain text, added markers such as <tool_call> too
        # (hybridllm.prompts.tokenize_prompt, llama_plain)
        with self._gate.enter():  # the cached encoder below calls into the model: never after close
            if self._plain is None:  # one pass over the vocabulary, on first use
                self._plain = llama_plain(self._llm)
            special_ids, encode_plain = self._plain
            ids = tokenize_prompt(self.prompt_format, messages, prefix=prefix,
                                  special_ids=special_ids, encode_plain=encode_plain, tools=tools)
            # what llama.cpp's add_special puts first for this model (BOS or nothing), unless the
            # template wrote it already
            start = list(self._llm.tokenize(b"", add_bos=True, special=False))
        if start and ids[: len(start)] != start:
            ids[:0] = start
        return ids

    def _vocabulary(self) -> tuple[list[bytes | None], set[int]]:
        with self._gate.enter():  # reads the model's vocabulary: never after close
            return llama_vocabulary(self._llm)

    def _run(self, tokens: list[int], params: GenerationParams,
             stops: tuple[str, ...]) -> Iterator[Delta]:
        # a response_format (or a forced tool call) is parsed here, so a bad one fails before the
        # stream starts; a request without one touches none of it
        constraint = self._formats.start(params) if constrained(params) else None
        return self._run_alone(tokens, params, stops, constraint)

    def _run_alone(self, tokens: list[int], params: GenerationParams, stops: tuple[str, ...],
                   constraint: Constraint | None) -> Iterator[Delta]:
        # one llama.cpp context runs one generation at a time. HybridLLM queues requests on one
        # thread (backends/worker.py); a direct caller overlapping two streams gets a clear
        # error at once instead of a lock that a reader holds while it reads
        if not self._busy.acquire(blocking=False):
            raise EdgeBusyError(
                "This LlamaCppBackend is already generating; one stream at a time. Use HybridLLM "
                "(which queues requests) or close the other stream first.")
        try:
            yield from self._generate(tokens, params, stops, constraint)
        finally:
            self._busy.release()

    def _generate(self, tokens: list[int], params: GenerationParams,
                  stops: tuple[str, ...], constraint: Constraint | None = None) -> Iterator[Delta]:
        import numpy as np
        from llama_cpp import llama_cpp as C

        # llama.cpp takes a 32-bit seed and reads 0xFFFFFFFF (what -1 wraps to) as "draw a random
        # one": folding modulo 2**32 - 1 keeps every seed, -1 included, repeatable as on ONNX
        seed = params.seed % (2**32 - 1) if params.seed is not None else random.randrange(2**31)
        with self._gate.enter():
            llm = self._llm
            llm.set_seed(seed)
            self._threads_for_this_process(llm)
        budget = min(params.max_tokens, self.context_length - len(tokens))
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        matcher = StopMatcher(stops)
        n_out, finish = 0, "length"
        if constraint is not None:
            constraint.bind()  # the model's first structured request builds the token index
        # llama.cpp's penalties count the tokens its sampler drew (the answer, not the prompt),
        # over its last 64 (last_n_tokens_size): presence and frequency as OpenAI's rule. A
        # response_format's mask is the first stage of its sampler chain (before the penalties,
        # top-k/top-p/min-p and temperature, as vLLM orders them): refused tokens get -inf
        gen = llm.generate(  # lazy: nothing runs before the first next()
            tokens, temp=params.temperature, top_p=params.top_p, top_k=params.top_k,
            min_p=params.min_p, repeat_penalty=params.repeat_penalty, reset=True,
            presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
            logits_processor=[constraint.logits_processor()] if constraint is not None else None,
        )
        try:
            with self._gate.enter():
                _prefill_head(llm, tokens)
            # a continuation whose prefix completed the value: nothing may follow it
            done = constraint is not None and constraint.finished
            if done:
                finish = "stop"
            while not done:
                if stop_requested():  # its reader left: stop here, text or none (see .cancel)
                    return
                # each step (a decode, the token's logits and text) runs inside the gate: close()
                # from another thread waits for the step, and the next one finds the backend closed.
                # The yield is outside it, so a reader that stops reading never holds close() up.
                # the prompt is in (its prefill above): a close from here on cut an answer begun
                with self._gate.enter(_CLOSED_MID_ANSWER):
                    token = next(gen, None)
                    if token is None:  # the generator ended on its own (it does not, today)
                        break
                    _check_finite(llm._ctx.get_logits(), token, self._n_vocab)
                    if constraint is not None:
                        constraint.check()  # an error inside the mask's native callback
                    if C.llama_vocab_is_eog(llm._model.vocab, token):
                        finish = "stop"
                        break
                    if constraint is not None:
                        constraint.feed(token)
                    n_out += 1
                    logprob = None
                    if params.logprobs:
                        # [n_vocab] logits of the position that produced `token`
                        row = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(self._n_vocab,))
                        peak = float(row.max())
                        logprob = float(row[token] - peak - np.log(np.exp(row - peak).sum()))
                    piece = llama_bytes(llm, [token])
                text, hit = matcher.feed(decoder.decode(piece))
                if text or logprob is not None:
                    yield Delta(text, logprob=logprob)
                # a structured answer ends once its value is complete and nothing may follow
                # (the end-of-text token the mask would force next is not drawn)
                if hit or (constraint is not None and constraint.finished):
                    finish = "stop"
                    break
                if n_out >= budget:
                    break
        except HybridLLMError:
            raise  # ours (closed mid-answer): already says what happened
        except Exception as exc:
            # llama-cpp-python raises RuntimeError ("llama_decode returned 1"), but also ValueError
            # and AssertionError from its own bookkeeping: those went out raw (through HybridLLM:
            # "fix that backend or pass another as edge=", for the built-in one). The context is
            # reset by the next generation, so the backend stays usable
            said = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise EdgeError(
                f"llama.cpp failed while generating ({said}); the answer is incomplete. Retry the "
                "request; if it fails again, check the model file (`hybridllm models verify`) or "
                "lower n_ctx (too little memory).") from exc
        finally:
            gen.close()  # stops decoding at once when the caller breaks out (no native call)
        # the bytes of a character cut by max_tokens (or by the end of the answer) are dropped, never
        # sent as U+FFFD, so the deltas join to the final text as the characters they are; text held
        # back as the start of a stop string that never came is the answer's own (after a stop
        # string, nothing is held)
        tail = matcher.flush()
        yield Delta(tail, finish_reason=finish, usage=Usage(len(tokens), n_out))

    def _threads_for_this_process(self, llm: Any) -> None:
        """One thread in a fork of a process whose decodes made llama.cpp's thread pool (see
        _POOL_PID): there a decode on more threads hung for ever (a fork-based multiprocessing Pool
        or a preloading gunicorn whose parent had answered). Said once, with the way to all threads."""
        global _POOL_PID
        if self.n_threads <= 1:
            return
        here = os.getpid()
        if _POOL_PID is None or _POOL_PID == here:
            _POOL_PID = here
            return
        log.warning(
            "llama.cpp decoded on %d threads in process %d, of which this process %d is a fork: its "
            "thread pool is not here, so %s runs on one thread (on more it would wait for ever). For "
            "all threads, start processes with the 'spawn' method, or answer nothing in the parent "
            "before it forks.", self.n_threads, _POOL_PID, here, self.model)
        llm._ctx.set_n_threads(1, 1)
        self.n_threads = 1

    def close(self) -> None:
        """Free the model. Safe from any thread and more than once: a generation running on
        another thread stops after its current token (its reader gets an EdgeError), and every
        later call raises EdgeError saying the backend is closed."""
        self._close(None)

    def _close(self, timeout_s: float | None) -> None:
        gate = getattr(self, "_gate", None)  # absent when __init__ failed before it
        # False also when a step outlived timeout_s (at exit): the model is not freed under it
        if gate is None or not gate.close(timeout_s):
            return
        llm, self._llm = getattr(self, "_llm", None), None
        self._plain = None  # its encoder holds the Llama object: it must go with it
        formats = getattr(self, "_formats", None)
        if formats is not None:  # the token index: megabytes, of no use once the model is gone
            formats.forget()
        if llm is not None:
            llm.close()
            del llm
            return_freed_memory()


def _factory(**kwargs: Any) -> LlamaCppBackend:
    return LlamaCppBackend(**kwargs)


register_backend("llama_cpp", _factory)

__all__ = ["DEFAULT_MODEL", "LlamaCppBackend", "StopMatcher"]
