"""Around a llama.cpp load: its log lines, a GGUF's trained context length, the re-pull advice."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..models.catalog import ModelSpec, load_catalog
from ..models.store import model_dir

_LOG_HOOK: Any = None  # our llama.cpp log callback (kept referenced: C holds only its pointer)
_LOG_LOCK = threading.Lock()  # two loads at once: one hook, the one C holds is the one kept
_LOADING = threading.local()  # .reasons: llama.cpp's "error loading model" lines while this thread loads


def _route_llama_logs() -> None:
    """llama.cpp's log lines go to the ``hybridllm.llama_cpp`` logger at DEBUG, unless a model was
    loaded with ``verbose=True`` (then to stderr, as llama-cpp-python prints them). Its default
    prints ERROR-level lines that are advice, not failures ("using full-size SWA cache" for every
    Gemma 3 load), onto the clean stderr of `hybridllm ask`; a real load failure still raises.

    And a quiet load (``verbose=False``) no longer points the process's stdout and stderr at
    /dev/null (``_keep_output_streams``). Call it before any ``Llama(...)``."""
    with _LOG_LOCK:
        # two threads loading models at once each made and set a hook; the one C kept could be
        # the one whose reference was overwritten here, freed: the next llama.cpp log line jumped
        # into freed memory
        if _LOG_HOOK is None:
            _set_log_hook()
            _keep_output_streams()


@contextlib.contextmanager
def load_reasons() -> Iterator[list[str]]:
    """llama.cpp's "error loading model" lines while this thread loads (our log hook collects
    them): llama-cpp-python's own error says only "Failed to load model from file"."""
    reasons: list[str] = []
    _LOADING.reasons = reasons
    try:
        yield reasons
    finally:
        _LOADING.reasons = None


def _streams_kept(disable: bool = True) -> contextlib.nullcontext[None]:
    """llama-cpp-python's ``suppress_stdout_stderr``, doing nothing (its signature kept)."""
    return contextlib.nullcontext()


def _keep_output_streams() -> None:
    """A quiet llama-cpp-python load (``verbose=False``) dup2s file descriptors 1 and 2 onto
    /dev/null while llama.cpp reads the model, for the whole process: whatever another thread
    wrote meanwhile was lost (a server's log lines while its model loaded, its "shut down while the
    model was loading" before ``os._exit``, an app's own output). With our log hook set, llama.cpp's
    lines reach the hook, not those descriptors, so the silencing has nothing left to hide."""
    import llama_cpp._internals
    import llama_cpp.llama

    for module in (llama_cpp.llama, llama_cpp._internals):
        if hasattr(module, "suppress_stdout_stderr"):
            module.suppress_stdout_stderr = _streams_kept  # type: ignore[attr-defined]


def _set_log_hook() -> None:
    global _LOG_HOOK
    import ctypes
    import sys

    import llama_cpp

    printer = logging.getLogger("llama-cpp-python")  # llama-cpp-python's verbose switch sets its level
    ours = logging.getLogger("hybridllm.llama_cpp")

    @llama_cpp.llama_log_callback  # type: ignore[misc]
    def hook(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        line = text.decode("utf-8", errors="replace")
        reasons = getattr(_LOADING, "reasons", None)
        if reasons is not None and "error loading model:" in line:
            reasons.append(line.split("error loading model:", 1)[1].strip())
        if printer.level == logging.DEBUG:  # verbose=True (set_verbose): as llama-cpp-python would
            print(line, end="", flush=True, file=sys.stderr)
        elif line.strip():
            ours.debug("%s", line.rstrip())

    llama_cpp.llama_log_set(hook, ctypes.c_void_p(0))
    _LOG_HOOK = hook


def _trained_context(path: Path) -> int | None:
    """``{architecture}.context_length`` from a GGUF file's header (None if it cannot be read).

    llama.cpp tells the trained length only once a context was made, and it makes the context at
    the n_ctx asked: n_ctx=65536 on SmolLM2 (trained on 8192) first filled 1.6 GB of KV cache to
    keep 190 MB, and n_ctx=10**6 failed as "too little memory" instead of being cut to 8192."""
    import struct

    from ..models.gguf_header import read_gguf_metadata

    try:
        meta = read_gguf_metadata(path)
    except (OSError, ValueError, KeyError, struct.error, OverflowError):
        # not readable here (OverflowError: a damaged length past any offset, which escaped as a
        # raw traceback where llama.cpp names the damaged file): llama.cpp says why
        return None
    length = meta.get(f"{meta.get('general.architecture')}.context_length")
    return length if isinstance(length, int) and not isinstance(length, bool) else None


def _llama_version() -> str:
    import llama_cpp

    return str(getattr(llama_cpp, "__version__", "?"))


def _repull_hint(path: Path, spec: ModelSpec | None) -> str:
    """What to do about a GGUF file llama.cpp cannot read: the command that puts it back."""
    if spec is None:  # a truncated copy of a catalog file no longer matches its size: by name
        spec = next((s for s in load_catalog().values()
                     if s.kind == "gguf" and s.main_file.name == path.name), None)
        if spec is None:
            return ("Download it again, or pass another .gguf file (or a catalog id: "
                    "`hybridllm models list`).")
    command = f"`hybridllm models pull {spec.id} --force`"
    if path.resolve() == (model_dir(spec) / spec.main_file.name).resolve():
        return f"Pull it again with {command}."
    return f"Pull it again with {command} and copy the file it prints to {path}, or pass another .gguf file."
