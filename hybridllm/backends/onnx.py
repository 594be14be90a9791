"""The on-device backend on ONNX Runtime GenAI (onnxruntime-genai), the runtime mobile apps ship.

The model is a folder prepared once from the catalog's GGUF (:mod:`hybridllm.models.onnx_prepare`).
ONNX Runtime GenAI runs the model and keeps the KV cache; we drive the token loop ourselves, as
the llama.cpp backend does, for the same behaviour on both runtimes:

- each step appends the last token (``append_tokens``) and reads the next token's logits, so the
  first token is out right after the prompt's prefill and nothing runs after the caller stops;
- sampling is ours (``onnx_sampling._sample``: top-k, top-p, min-p, temperature, repeat penalty,
  as llama.cpp orders them) with a per-request seed, and the log-probability comes from the same logits;
- the KV cache survives between requests: a new prompt rewinds to the longest common prefix
  (``rewind_to``), so a conversation's next turn prefills only what is new. Each step takes the
  lock and re-syncs the cache to its own sequence, so no lock is held while the caller reads and
  two streams from any threads interleave correctly (each step re-prefills what the other changed).
  Their answers may still differ from one-at-a-time runs, greedy too: the re-prefill runs as one
  chunk, which the int4 kernels round differently from single tokens, so a near-tie can flip. That
  is rounding, not a race (tests/backends/test_onnx_threads_review30.py); run requests one at a
  time (as HybridLLM does) where answers must repeat exactly.
- on Linux the memory the model load allocated (the runtime's repacked weights) is moved onto 2 MB
  pages (``huge_pages``, see :func:`.onnx_memory._advise_huge_pages`): each decode step reads every
  weight, and on 4 kB pages a step took 15-20% longer (SmolLM2 and Qwen 0.5B, one thread, measured).
"""

from __future__ import annotations

import json
import os
import random
import threading
from collections.abc import Iterator
from typing import Any

from .._exceptions import ConfigError, EdgeError, ModelCorruptError
from .._types import GenerationParams, Messages, Usage
from ..models.onnx_store import DEFAULT_PRECISION, read_meta, resolve_onnx
from ..models.store import Progress
from ..prompts import PromptFormat, tokenize_prompt, tokenizers_plain
from .base import (
    Delta,
    DeviceBackend,
    StopMatcher,
    check_device_settings,
    register_backend,
    return_freed_memory,
)
from .cancel import stop_requested
from .llama_cpp import DEFAULT_MODEL
from .onnx_folder import (
    _check_graph_io,
    _context_size,
    _named_eog_ids,
    _prompt_files,
    _reprepare_hint,
    _trained_context,
)
from .onnx_memory import _advise_huge_pages, _anon_regions
from .onnx_sampling import _finite, _sample
from .structured import Constraint, DeviceFormats, constrained, tokenizers_vocabulary

_ORT_LOG_FATAL = 4  # ONNX Runtime's log severities: 0 verbose .. 3 error, 4 fatal
_CLOSED = "The ONNX backend is closed; create a new OnnxBackend to generate again."
_CLOSED_MID_ANSWER = (
    "The ONNX backend was closed while it was generating; the answer is incomplete. Create a new "
    "OnnxBackend to generate again."
)
_LLAMA_ONLY = frozenset({"n_batch", "verbose"})  # LlamaCppBackend's settings, taken and ignored here


class OnnxBackend(DeviceBackend):
    """Chat and completion on a prepared ONNX Runtime GenAI model folder on the CPU."""

    name = "onnx"

    def __init__(
        self,
        model: str | os.PathLike[str] = DEFAULT_MODEL,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        precision: str = DEFAULT_PRECISION,
        chat_format: str | None = None,  # "template", "completion" or None (from the model)
        system_prompt: str | None = None,  # used when a conversation has none; "" = never
        progress: Progress | None = None,
        huge_pages: bool = True,  # back the loaded weights with 2 MB pages (Linux), see above
        **_unused: Any,  # llama.cpp-only settings (n_batch, verbose) a shared config may pass
    ) -> None:
        # the llama.cpp backend's rules, before anything is prepared or loaded: n_ctx=-1 refused
        # every prompt ("the context holds -1"), and n_threads=-1 was reported as a corrupt folder
        check_device_settings(n_ctx, n_threads)
        unknown = sorted(set(_unused) - _LLAMA_ONLY)
        if unknown:  # a misspelt setting (precison="fp32") was dropped without a word
            raise ConfigError(
                f"OnnxBackend got unknown settings: {', '.join(unknown)}. It takes model, n_ctx, "
                "n_threads, precision, chat_format, system_prompt, progress and huge_pages (and "
                "ignores the llama.cpp-only n_batch and verbose).")
        if chat_format not in (None, "template", "completion"):
            # as the llama.cpp backend: a name of another tool ("chatml") silently became the plain
            # completion transcript, a prompt the model was not tuned on
            raise ConfigError(
                f"chat_format must be 'template' (the model's own chat template), 'completion' or "
                f"None (from the model), got {chat_format!r}.")
        self.model, self.model_path, spec = resolve_onnx(model, precision=precision, progress=progress)
        try:
            import onnxruntime_genai as og
        except ImportError as exc:
            raise EdgeError(
                "The ONNX backend needs onnxruntime-genai: pip install 'hybridllm[onnx]'"
            ) from exc
        self._og = og
        self.n_threads = n_threads
        # the folder's own files first: one that is damaged is reported before the weights load
        # (seconds, and gigabytes), not after
        try:
            self._special_ids, self._encode_plain = tokenizers_plain(self.model_path / "tokenizer.json")
        except Exception as exc:  # tokenizers raises plain Exceptions
            raise ModelCorruptError(
                f"{self.model_path} has no readable tokenizer.json ({exc}). "
                + _reprepare_hint(self.model_path, spec, precision)
            ) from exc
        try:  # read before the runtime parses it: a damaged config is ours to report
            genai = json.loads((self.model_path / "genai_config.json").read_text(encoding="utf-8"))["model"]
            if not isinstance(genai, dict):
                raise TypeError(f"'model' is a {type(genai).__name__}, not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelCorruptError(
                f"{self.model_path / 'genai_config.json'} is unreadable ({exc!r}). "
                + _reprepare_hint(self.model_path, spec, precision)
            ) from exc
        meta = read_meta(self.model_path)
        try:
            template, bos, eos, add_bos = _prompt_files(self.model_path, meta)
        except ModelCorruptError as exc:
            raise ModelCorruptError(f"{exc} {_reprepare_hint(self.model_path, spec, precision)}") from exc
        if chat_format is None:
            chat_format = (
                (spec.chat_format if spec else None)
                or meta.get("chat_format")
                or ("template" if template else "completion")
            )
        if chat_format == "template" and not template:
            raise ModelCorruptError(f"{self.model_path} has no chat template; use chat_format='completion'.")
        self.chat_format = chat_format
        if system_prompt is None:
            system_prompt = (spec.extra.get("system_prompt") if spec else None) or meta.get("system_prompt")
        self.system_prompt = system_prompt or None
        self.prompt_format = PromptFormat(
            chat_template=template if chat_format == "template" else None,
            bos_token=bos,
            eos_token=eos,
            system_prompt=self.system_prompt,
        )
        self._add_bos = add_bos
        self._bos_id = genai.get("bos_token_id")
        try:
            trained = _trained_context(genai, self.model_path)
        except ModelCorruptError as exc:
            raise ModelCorruptError(f"{exc} {_reprepare_hint(self.model_path, spec, precision)}") from None
        self._n_ctx = _context_size(n_ctx, trained, self.model_path)
        try:
            config = og.Config(str(self.model_path))
            # the runtime's own log would print a load failure to stderr as well as raising it
            # (a raw C++ line in the app's terminal); the error reaches the caller as ours, below
            options: dict[str, int] = {"log_severity_level": _ORT_LOG_FATAL}
            if n_threads:
                options.update(intra_op_num_threads=int(n_threads), inter_op_num_threads=1)
            config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
            try:  # before the weights load: a graph the runtime cannot feed failed on every request
                _check_graph_io(self.model_path)
            except ModelCorruptError as exc:
                hint = _reprepare_hint(self.model_path, spec, precision)
                raise ModelCorruptError(f"{exc} {hint}") from None
            before = _anon_regions() if huge_pages else {}
            self._model: Any = og.Model(config)
            self.huge_page_bytes = _advise_huge_pages(before) if huge_pages else 0
            self._tok: Any = og.Tokenizer(self._model)
        except (RuntimeError, UnicodeDecodeError) as exc:
            # the exception's traceback holds this half-made backend: without this, a caller that
            # kept the error (to log it, to retry later) kept the loaded weights with it
            self._model = self._tok = None
            raise ModelCorruptError(
                f"ONNX Runtime GenAI could not load {self.model_path} ({_runtime_said(exc)}): a file of "
                f"the folder is missing, truncated or corrupt. "
                f"{_reprepare_hint(self.model_path, spec, precision)}"
            ) from exc
        eos_ids = genai.get("eos_token_id", [])
        self._eos_ids = set(eos_ids if isinstance(eos_ids, list) else [eos_ids])
        self._eos_ids.update(int(t) for t in self._tok.eos_token_ids)
        if eos:
            self._eos_ids.add(int(self._tok.to_token_id(eos)))
        # and every end-of-text token llama.cpp ends on by name: the builder's genai_config names
        # one, but a chat model may end with another (SmolLM2 and Qwen: <|endoftext|> as well as
        # <|im_end|>); without them ONNX went on writing past the end where llama.cpp stopped
        self._eos_ids.update(_named_eog_ids(self.model_path))
        # response_format: the token index (from the folder's tokenizer.json, as wide as the
        # model's head), built at the first structured request
        head = genai.get("vocab_size")
        head = head if isinstance(head, int) and not isinstance(head, bool) and head > 0 else 0
        self._formats = DeviceFormats(lambda: tokenizers_vocabulary(
            self.model_path / "tokenizer.json", head, self._eos_ids))
        self._lock = threading.Lock()
        self._gen: Any = None  # one generator (one KV cache), made on first use
        self._cached: list[int] = []  # the tokens the KV cache holds
        self._last_row: Any = None  # logits after ``_cached``

    @property
    def context_length(self) -> int:
        self._check_open()
        return self._n_ctx

    def _check_open(self) -> None:
        """A closed backend says so on every call, as the llama.cpp one does, not only on generate."""
        if self._model is None:
            raise EdgeError(_CLOSED)

    def render(self, messages: Messages) -> str:
        self._check_open()
        return super().render(messages)

    def tokenize(self, messages: Messages, *, prefix: str = "",
                 tools: list[dict[str, Any]] | None = None) -> list[int]:
        self._check_open()
        # only the template's own markers become control tokens; every message's text and the
        # prefix are read as plain text (hybridllm.prompts.tokenize_prompt). The runtime's own
        # tokenizer cannot leave special tokens unparsed, so the folder's tokenizer.json is read
        # with ``tokenizers`` (the same ids for ordinary prompts: tests/backends/test_special_tokens)
        ids = tokenize_prompt(self.prompt_format, messages, prefix=prefix,
                              special_ids=self._special_ids, encode_plain=self._encode_plain, tools=tools)
        if self._add_bos and self._bos_id is not None and (not ids or ids[0] != self._bos_id):
            ids.insert(0, int(self._bos_id))
        return ids


    def _logits(self, seq: list[int], closed_message: str = _CLOSED) -> Any:
        """[vocab] logits of the token after ``seq``, reusing the cache's common prefix."""
        import numpy as np

        with self._lock:
            if self._model is None:
                raise EdgeError(closed_message)
            # The prompt's last token always runs on its own: the int4 kernels round a chunk a
            # little differently from a single token (logits move by up to 0.35 on SmolLM2), and a
            # repeated request, which reuses the cache up to that token, must see the same logits
            # as the first one did, or a seed would not repeat its answer.
            cached = self._cached
            if cached == seq and self._last_row is not None:
                return self._last_row
            common = 0
            if len(cached) < len(seq) and seq[: len(cached)] == cached:
                common = len(cached)  # the usual step: one new token after our own sequence
            else:
                for a, b in zip(cached, seq, strict=False):
                    if a != b:
                        break
                    common += 1
                common = min(common, len(seq) - 1)  # at least one token must run for logits
            try:
                if self._gen is None or common == 0:
                    params = self._og.GeneratorParams(self._model)
                    params.set_search_options(max_length=self._n_ctx)
                    self._gen, common = self._og.Generator(self._model, params), 0
                elif common < len(cached):
                    self._gen.rewind_to(common)
                self._cached = []  # unknown until the append below succeeds
                if len(seq) - common > 1:  # the last token runs alone, see below
                    self._gen.append_tokens(seq[common:-1])
                self._gen.append_tokens(seq[-1:])
                row = np.asarray(self._gen.get_logits()[0, -1], dtype=np.float32)  # [vocab], a copy
            except RuntimeError as exc:
                self._gen, self._last_row = None, None
                raise EdgeError(f"ONNX Runtime GenAI failed while generating: {exc}") from exc
            self._cached, self._last_row = list(seq), row
            return row

    def _run(
        self, tokens: list[int], params: GenerationParams, stops: tuple[str, ...]
    ) -> Iterator[Delta]:
        # a response_format (or a forced tool call) is parsed here, so a bad one fails before the
        # stream starts; a request without one touches none of it
        constraint = self._formats.start(params) if constrained(params) else None
        return self._steps(tokens, params, stops, constraint)

    def _steps(self, tokens: list[int], params: GenerationParams, stops: tuple[str, ...],
               constraint: Constraint | None) -> Iterator[Delta]:
        import numpy as np

        seed = params.seed if params.seed is not None else random.randrange(2**31)
        budget = min(params.max_tokens, self.context_length - len(tokens))
        with self._lock:
            if self._tok is None:  # closed: say so, not "'NoneType' object has no attribute"
                raise EdgeError(_CLOSED)
            detok = self._tok.create_stream()
        matcher = StopMatcher(stops)
        seq, n_out, finish = list(tokens), 0, "length"
        if constraint is not None:
            constraint.bind()  # the model's first structured request builds the token index
            if constraint.finished:  # a continuation whose prefix completed the value
                budget, finish = 0, "stop"
        while n_out < budget:
            if stop_requested():  # its reader left: stop here, text or none (see .cancel)
                return
            # closed half way: say the answer is incomplete, as the llama.cpp backend does
            # +inf/-inf logits given their meaning, a NaN refused (the log-probability below too)
            row = _finite(self._logits(seq, _CLOSED_MID_ANSWER if n_out else _CLOSED))
            if constraint is None:
                token = _sample(row, params, seed, n_out, seq[len(tokens) :])
            else:  # the format's mask goes first in the sampler (onnx_sampling._sample)
                token = _sample(row, params, seed, n_out, seq[len(tokens) :],
                                allowed=constraint.allowed(row.shape[0]))
            if token in self._eos_ids:
                finish = "stop"
                break
            if constraint is not None:
                constraint.feed(token)
            n_out += 1
            logprob = None
            if params.logprobs:
                peak = float(row.max())  # log p(token) = logit - logsumexp(logits)
                logprob = float(row[token] - peak - np.log(np.exp(row - peak).sum()))
            text, hit = matcher.feed(detok.decode(token))
            if text or logprob is not None:
                yield Delta(text, logprob=logprob)  # the caller may stop here: nothing else runs
            # a structured answer ends once its value is complete and nothing may follow (the
            # end-of-text token the mask would force next is not drawn)
            if hit or (constraint is not None and constraint.finished):
                finish = "stop"
                break
            seq.append(token)
        # text held back as the start of a stop string that never came is the answer's own, also
        # when the model ends right after it (after a stop string, nothing is held)
        tail = matcher.flush()
        yield Delta(tail, finish_reason=finish, usage=Usage(len(tokens), n_out))

    def close(self) -> None:
        with self._lock:
            had_model = self._model is not None
            self._gen, self._cached, self._last_row = None, [], None
            self._tok = self._model = None
        formats = getattr(self, "_formats", None)
        if formats is not None:  # the token index: megabytes, of no use once the model is gone
            formats.forget()
        if had_model:
            return_freed_memory()


def _runtime_said(exc: Exception) -> str:
    """The runtime's error message. One that quotes a damaged name from model.onnx (a flipped
    byte: not UTF-8) reaches Python as a UnicodeDecodeError of the message itself, which went out
    raw ("'utf-8' codec can't decode byte 0xe6"): its bytes are the message, read leniently."""
    if isinstance(exc, UnicodeDecodeError):
        return bytes(exc.object).decode("utf-8", errors="replace")
    return str(exc)


def _factory(**kwargs: Any) -> OnnxBackend:
    return OnnxBackend(**kwargs)


register_backend("onnx", _factory)

__all__ = ["OnnxBackend"]
