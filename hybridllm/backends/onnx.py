"""The on-device backend on ONNX Runtime GenAI (onnxruntime-genai), the runtime mobile apps ship.

The model is a folder prepared once from the catalog's GGUF (:mod:`hybridllm.models.onnx_prepare`).
ONNX Runtime GenAI runs the model and keeps the KV cache; we drive the token loop ourselves, as
the llama.cpp backend does, for the same behaviour on both runtimes:

- each step appends the last token (``append_tokens``) and reads the next token's logits, so the
  first token is out right after the prompt's prefill and nothing runs after the caller stops;
- sampling is ours (``_sample``: top-k, top-p, min-p, temperature, repeat penalty, as llama.cpp
  orders them) with a per-request seed, and the log-probability comes from the same logits;
- the KV cache survives between requests: a new prompt rewinds to the longest common prefix
  (``rewind_to``), so a conversation's next turn prefills only what is new. Each step takes the
  lock and re-syncs the cache to its own sequence, so no lock is held while the caller reads and
  two streams from any threads interleave correctly (each step re-prefills what the other changed).
- on Linux the memory the model load allocated (the runtime's repacked weights) is moved onto 2 MB
  pages (``huge_pages``, see :func:`_advise_huge_pages`): each decode step reads every weight, and
  on 4 kB pages a step took 15-20% longer (SmolLM2 and Qwen 0.5B, one thread, measured).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import random
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._exceptions import ConfigError, EdgeError, ModelCorruptError
from .._types import GenerationParams, Messages, Usage
from ..models.onnx_store import (
    DEFAULT_PRECISION,
    META_FILE,
    onnx_dir,
    prepare_command,
    read_meta,
    resolve_onnx,
)
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
from .llama_cpp import DEFAULT_MODEL

_PENALTY_WINDOW = 64  # llama.cpp's default repeat_last_n
_CANDIDATE_NATS = 30.0
_HUGE_PAGE = 2 << 20  # the PMD size of x86-64 and arm64 (4 kB base pages)
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25  # <sys/mman.h>; MADV_COLLAPSE since Linux 6.1
_ORT_LOG_FATAL = 4  # ONNX Runtime's log severities: 0 verbose .. 3 error, 4 fatal
_CLOSED = "The ONNX backend is closed; create a new OnnxBackend to generate again."
_CLOSED_MID_ANSWER = (
    "The ONNX backend was closed while it was generating; the answer is incomplete. Create a new "
    "OnnxBackend to generate again."
)
_LLAMA_ONLY = frozenset({"n_batch", "verbose"})  # LlamaCppBackend's settings, taken and ignored here
log = logging.getLogger("hybridllm.edge")


def _reprepare_hint(folder: Path, spec: Any, precision: str) -> str:
    """What to do about a broken prepared folder: the command that builds it again (and, for a
    folder copied elsewhere, where to copy the result)."""
    if spec is None:
        return (
            f"Prepare it again with `{prepare_command('ID')} --force` (ID: the catalog model it was "
            f"built from) and copy the folder it prints to {folder}, or rebuild it with the model "
            "builder."
        )
    try:
        precision = str(read_meta(folder).get("precision") or precision)
    except ModelCorruptError:
        pass
    command = f"`{prepare_command(spec.id, precision)} --force`"
    if folder.resolve() == onnx_dir(spec.id, precision).resolve():
        return f"Prepare it again with {command}."
    return f"Prepare it again with {command} and copy the folder it prints to {folder}."


def _anon_regions() -> dict[tuple[int, int], tuple[int, bool]]:
    """This process's private writable anonymous mappings and its heap: (start, end) -> (Rss bytes,
    is the heap)."""
    regions: dict[tuple[int, int], tuple[int, bool]] = {}
    key: tuple[int, int] | None = None
    heap = False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split()
                if "-" in head[0] and len(head) >= 5:  # a mapping's header line
                    name = head[5] if len(head) > 5 else ""
                    key, heap = None, name == "[heap]"
                    if head[1].startswith("rw") and head[1].endswith("p") and name in ("", "[heap]"):
                        lo, hi = (int(x, 16) for x in head[0].split("-"))
                        key = (lo, hi)
                elif key is not None and head[0] == "Rss:":
                    regions[key] = (int(head[1]) * 1024, heap)
    except (OSError, ValueError, IndexError):
        return {}
    return regions


def _resident_bytes(libc: Any, lo: int, hi: int) -> int:
    """Resident bytes of the page-aligned range [lo, hi) of this process (``mincore``; 0 if it
    fails)."""
    page = os.sysconf("SC_PAGE_SIZE")
    vec = (ctypes.c_ubyte * ((hi - lo + page - 1) // page))()
    mincore = libc.mincore
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    if mincore(lo, hi - lo, vec) != 0:
        return 0
    return sum(b & 1 for b in bytes(vec)) * page


def _new_parts(lo: int, hi: int, old: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[lo, hi) less the ``old`` ranges (sorted): the kernel merges a new mapping into an old one
    next to it with the same flags, so one mapping now can be part old memory, part new."""
    parts, at = [], lo
    for a, b in old:
        if b <= at or a >= hi:
            continue
        if a > at:
            parts.append((at, a))
        at = max(at, b)
    if at < hi:
        parts.append((at, hi))
    return parts


def _advise_huge_pages(before: dict[tuple[int, int], tuple[int, bool]]) -> int:
    """Put the mostly-filled anonymous memory mapped since ``before``, and the heap, on huge pages.
    (The heap always: a process that freed much memory before, as a build does, gets the model's
    weights put into the heap's free space, which changes no mapping.)

    ``madvise(MADV_HUGEPAGE)`` lets the kernel use 2 MB pages there where THP is in ``madvise`` mode
    (the usual default), and ``MADV_COLLAPSE`` moves what is already filled in now instead of
    waiting for khugepaged. Only ranges at least half resident are advised, so reserved but
    untouched space (thread stacks, an arena's tail) is not filled, and only the new part of a
    mapping the kernel merged with an old one (the old part may be another arena's reserve).
    Returns the bytes advised; 0 off Linux or where the kernel refuses (it is only a hint: nothing
    else changes).
    """
    if sys.platform != "linux":
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        return 0
    old = sorted(key for key, (_, heap) in before.items() if not heap)
    advised = 0
    for (lo, hi), (rss, heap) in _anon_regions().items():
        for a, b in [(lo, hi)] if heap else _new_parts(lo, hi, old):
            resident = rss if (a, b) == (lo, hi) else _resident_bytes(libc, a, b)
            if resident < (b - a) // 2:
                continue
            start = -(-a // _HUGE_PAGE) * _HUGE_PAGE  # the whole 2 MB pages inside [a, b)
            end = b // _HUGE_PAGE * _HUGE_PAGE
            if end - start < _HUGE_PAGE or madvise(start, end - start, _MADV_HUGEPAGE) != 0:
                continue
            madvise(start, end - start, _MADV_COLLAPSE)  # fails before Linux 6.1: khugepaged, later
            advised += end - start
    return advised


def _sample(row: Any, params: GenerationParams, seed: int, step: int, recent: list[int]) -> int:
    """Pick the ``step``-th answer token from ``row`` ([vocab] raw logits)."""
    import numpy as np

    penalty = float(getattr(params, "repeat_penalty", 1.0) or 1.0)
    if penalty != 1.0 and recent:
        # llama.cpp's rule: a seen token's positive logit is divided by the penalty, a negative one
        # multiplied, so both move towards "less likely"
        seen = np.unique(np.asarray(recent[-_PENALTY_WINDOW:]))
        row = row.copy()
        row[seen] = np.where(row[seen] > 0, row[seen] / penalty, row[seen] * penalty)
    if params.temperature == 0.0:
        return int(row.argmax())
    min_p = float(getattr(params, "min_p", 0.0) or 0.0)
    # candidates: tokens within 30 nats of the best at the larger of T and 1 (each one dropped has
    # p < e^-30 p_max under both softmaxes below), so a sort stays cheap on a 150k vocabulary
    peak = float(row.max())
    ids = np.flatnonzero(row >= peak - _CANDIDATE_NATS * max(params.temperature, 1.0))
    if 0 < params.top_k < ids.shape[0]:
        ids = ids[np.argpartition(row[ids], ids.shape[0] - params.top_k)[-params.top_k :]]
    # most likely first: a draw then moves to another token only when the logits really change,
    # not when numerical noise shifts a cumulative sum taken in vocabulary order
    ids = ids[np.argsort(-row[ids], kind="stable")]
    vals = row[ids].astype(np.float64)
    if params.top_p < 1.0 or min_p > 0.0:  # both judged on the untempered softmax, as llama.cpp does
        probs = np.exp(vals - vals[0])
        probs /= probs.sum()
        keep = ids.shape[0]
        if params.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), params.top_p) + 1)
        if min_p > 0.0:
            keep = min(keep, int((probs >= min_p * probs[0]).sum()))
        ids, vals = ids[: max(keep, 1)], vals[: max(keep, 1)]
    # p_i = softmax(logit_i / T) over the kept candidates, drawn by the Gumbel-max rule:
    #   pick = argmax_i(logit_i / T + g_i),  g_i = -log(-log u_i),  u_i ~ U(0, 1) i.i.d.
    # with u_i a hash of (seed, step, token id), so a seed repeats its answer even when the logits
    # differ in the last bits (a cache reused from another request, a chunked prefill)
    u = _uniform(ids, seed, step)
    return int(ids[np.argmax((vals - vals[0]) / params.temperature - np.log(-np.log(u)))])


def _uniform(ids: Any, seed: int, step: int) -> Any:
    """One U(0, 1) number per token id, fixed by (seed, step): splitmix64 over the ids."""
    import numpy as np

    mask = (1 << 64) - 1
    base = ((seed & mask) * 0x9E3779B97F4A7C15 + (step + 1) * 0xBF58476D1CE4E5B9) & mask
    with np.errstate(over="ignore"):
        x = ids.astype(np.uint64) * np.uint64(0x94D049BB133111EB) + np.uint64(base)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return ((x >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)  # in (0, 1)


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
        try:
            config = og.Config(str(self.model_path))
            # the runtime's own log would print a load failure to stderr as well as raising it
            # (a raw C++ line in the app's terminal); the error reaches the caller as ours, below
            options: dict[str, int] = {"log_severity_level": _ORT_LOG_FATAL}
            if n_threads:
                options.update(intra_op_num_threads=int(n_threads), inter_op_num_threads=1)
            config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
            before = _anon_regions() if huge_pages else {}
            self._model: Any = og.Model(config)
            self.huge_page_bytes = _advise_huge_pages(before) if huge_pages else 0
            self._tok: Any = og.Tokenizer(self._model)
        except RuntimeError as exc:
            raise ModelCorruptError(
                f"ONNX Runtime GenAI could not load {self.model_path} ({exc}): a file of the folder "
                f"is missing, truncated or corrupt. {_reprepare_hint(self.model_path, spec, precision)}"
            ) from exc
        try:
            self._special_ids, self._encode_plain = tokenizers_plain(self.model_path / "tokenizer.json")
        except Exception as exc:  # tokenizers raises plain Exceptions
            raise ModelCorruptError(
                f"{self.model_path} has no readable tokenizer.json ({exc}). "
                + _reprepare_hint(self.model_path, spec, precision)
            ) from exc
        genai = json.loads((self.model_path / "genai_config.json").read_text(encoding="utf-8"))["model"]
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
        eos_ids = genai.get("eos_token_id", [])
        self._eos_ids = set(eos_ids if isinstance(eos_ids, list) else [eos_ids])
        self._eos_ids.update(int(t) for t in self._tok.eos_token_ids)
        if eos:
            self._eos_ids.add(int(self._tok.to_token_id(eos)))
        # and every end-of-text token llama.cpp ends on by name: the builder's genai_config names
        # one, but a chat model may end with another (SmolLM2 and Qwen: <|endoftext|> as well as
        # <|im_end|>); without them ONNX went on writing past the end where llama.cpp stopped
        self._eos_ids.update(_named_eog_ids(self.model_path))
        self._n_ctx = _context_size(n_ctx, int(genai.get("context_length") or 0), self.model_path)
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

    def tokenize(self, messages: Messages, *, prefix: str = "") -> list[int]:
        self._check_open()
        # only the template's own markers become control tokens; every message's text and the
        # prefix are read as plain text (hybridllm.prompts.tokenize_prompt). The runtime's own
        # tokenizer cannot leave special tokens unparsed, so the folder's tokenizer.json is read
        # with ``tokenizers`` (the same ids for ordinary prompts: tests/backends/test_special_tokens)
        ids = tokenize_prompt(self.prompt_format, messages, prefix=prefix,
                              special_ids=self._special_ids, encode_plain=self._encode_plain)
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
        import numpy as np

        seed = params.seed if params.seed is not None else random.randrange(2**31)
        budget = min(params.max_tokens, self.context_length - len(tokens))
        with self._lock:
            if self._tok is None:  # closed: say so, not "'NoneType' object has no attribute"
                raise EdgeError(_CLOSED)
            detok = self._tok.create_stream()
        matcher = StopMatcher(stops)
        seq, n_out, finish = list(tokens), 0, "length"
        while n_out < budget:
            # closed half way: say the answer is incomplete, as the llama.cpp backend does
            row = self._logits(seq, _CLOSED_MID_ANSWER if n_out else _CLOSED)
            token = _sample(row, params, seed, n_out, seq[len(tokens) :])
            if token in self._eos_ids:
                finish = "stop"
                break
            n_out += 1
            logprob = None
            if params.logprobs:
                peak = float(row.max())  # log p(token) = logit - logsumexp(logits)
                logprob = float(row[token] - peak - np.log(np.exp(row - peak).sum()))
            text, hit = matcher.feed(detok.decode(token))
            if text or logprob is not None:
                yield Delta(text, logprob=logprob)  # the caller may stop here: nothing else runs
            if hit:
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
        if had_model:
            return_freed_memory()


def _context_size(n_ctx: int, trained: int, folder: Path) -> int:
    """The context a request may fill, as on llama.cpp: n_ctx=0 is the model's own length, and an
    n_ctx past it is cut to it with a warning (before: n_ctx=0 refused every prompt)."""
    if n_ctx == 0:
        if trained <= 0:
            raise ConfigError(
                f"n_ctx=0 asks for the model's own context length, and {folder / 'genai_config.json'} "
                "names none (model.context_length): pass n_ctx, a whole number of tokens.")
        return trained
    if 0 < trained < n_ctx:
        log.warning("n_ctx=%d is more than %s was built for (%d tokens); its context is %d",
                    n_ctx, folder.name, trained, trained)
        return trained
    return n_ctx


# the token texts llama.cpp's vocabulary loader marks end-of-generation by name (llama-vocab.cpp)
_EOG_NAMES = frozenset({
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<EOT>",
    "_<EOT>", "<|end\u2581of\u2581sentence|>", "<end_of_utterance>",
})


def _named_eog_ids(folder: Path) -> set[int]:
    """Ids of the special tokens in ``folder``'s tokenizer.json named in :data:`_EOG_NAMES`."""
    try:
        added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens") or []
        return {int(t["id"]) for t in added if t.get("special") and t.get("content") in _EOG_NAMES}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return set()


def _prompt_files(folder: Path, meta: dict[str, Any]) -> tuple[str | None, str, str, bool]:
    """(chat template, BOS text, EOS text, add BOS) from our record, else the builder's files.

    The chat template as transformers (and the cloud server) reads it: ``chat_template.jinja`` over
    the one in our record or ``tokenizer_config.json``, which may also be a list of named templates
    ({"name", "template"}) whose "default" is the chat template. A file that cannot be read is a
    :class:`ModelCorruptError` (before: ignored, and the folder's prompt format silently lost)."""
    tok_config: dict[str, Any] = {}
    path = folder / "tokenizer_config.json"
    if path.is_file():
        try:
            tok_config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ModelCorruptError(f"{path} is unreadable ({exc}).") from exc
        if not isinstance(tok_config, dict):
            raise ModelCorruptError(f"{path} must hold a JSON object, not a {type(tok_config).__name__}.")
    jinja = folder / "chat_template.jinja"
    template: str | None
    if jinja.is_file():
        try:
            template = jinja.read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:
            raise ModelCorruptError(f"{jinja} is unreadable ({exc}).") from exc
    else:
        template = (_named_template(meta.get("chat_template"), folder / META_FILE)
                    or _named_template(tok_config.get("chat_template"), path))

    def text(key: str) -> str:
        value = meta.get(key) or tok_config.get(key) or ""
        return str(value.get("content", "")) if isinstance(value, dict) else str(value)

    add_bos = bool(meta.get("add_bos_token", tok_config.get("add_bos_token", False)))
    return template or None, text("bos_token"), text("eos_token"), add_bos


def _named_template(template: Any, path: Path) -> str | None:
    """A ``chat_template`` value: a string, or transformers' list of named templates."""
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
        if template is None:
            raise ModelCorruptError(f"{path}: chat_template names no 'default' template "
                                    f"(has {sorted(map(str, named))}).")
    if template is not None and not isinstance(template, str):
        raise ModelCorruptError(f"{path}: chat_template must be a string or a list of named "
                                f"templates, not a {type(template).__name__}.")
    return template or None


def _factory(**kwargs: Any) -> OnnxBackend:
    return OnnxBackend(**kwargs)


register_backend("onnx", _factory)

__all__ = ["OnnxBackend"]
