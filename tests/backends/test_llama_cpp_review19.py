"""The llama.cpp backend with a fake ``Llama`` (review 19): no model is loaded.

- A generation that failed half way with anything but RuntimeError/OSError (llama-cpp-python's
  ValueError or AssertionError) went out raw, and a RuntimeError said only "llama.cpp failed while
  generating: llama_decode returned 1", nothing about what to do.
- Two threads loading models at once could leave llama.cpp holding a log hook that was freed.
- A model refused for having no chat template stayed loaded in the error's traceback.
"""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

import hybridllm.backends.llama_cpp as L  # noqa: E402
import hybridllm.backends.llama_cpp_load as LL  # noqa: E402
from hybridllm import EdgeError, GenerationParams, ModelCorruptError  # noqa: E402

EOS = 99


class _FakeLlm:
    """What ``_generate`` touches of a ``llama_cpp.Llama``; token i is ``pieces[i]``."""

    def __init__(self, pieces: list[bytes], fail_at: int | None = None,
                 exc: Exception | None = None) -> None:
        self.pieces, self.fail_at, self.exc = pieces, fail_at, exc
        self._model = type("M", (), {"vocab": None})()
        self.generations = 0
        # the KV cache's tokens: the backend decodes a prompt's head itself (review 21)
        self.input_ids, self.n_tokens = np.zeros(64, dtype=np.intc), 0
        # finite logits: the backend reads the drawn token's own (a NaN one is refused)
        logits = (ctypes.c_float * 128)()
        self._ctx = type("C", (), {"kv_cache_seq_rm": lambda self, seq, start, end: True,
                                   "get_logits": lambda self: logits})()

    def eval(self, tokens) -> None:
        self.input_ids[self.n_tokens : self.n_tokens + len(tokens)] = tokens
        self.n_tokens += len(tokens)

    def set_seed(self, seed: int) -> None:
        pass

    def generate(self, tokens, **kw):
        self.generations += 1
        for i in range(len(self.pieces)):
            if i == self.fail_at:
                self.fail_at = None  # fails once: the next generation runs
                raise self.exc
            yield i
        while True:
            yield EOS


@pytest.fixture
def fake_vocab(monkeypatch):
    monkeypatch.setattr(llama_cpp.llama_cpp, "llama_vocab_is_eog", lambda vocab, tok: tok == EOS)
    monkeypatch.setattr(L, "llama_bytes", lambda llm, ids, special=False:
                        b"".join(llm.pieces[i] for i in ids if i < len(llm.pieces)))


def _backend(llm: _FakeLlm, n_ctx: int = 64) -> L.LlamaCppBackend:
    b = L.LlamaCppBackend.__new__(L.LlamaCppBackend)
    b._busy, b._gate, b._llm, b._n_ctx, b._n_vocab = threading.Lock(), L._Gate(), llm, n_ctx, 100
    b.n_threads = 1
    return b


@pytest.mark.parametrize("exc", [RuntimeError("llama_decode returned -3"),
                                 ValueError("could not broadcast input array"),
                                 AssertionError()])
def test_a_generation_failing_half_way_is_one_edge_error_and_the_next_one_runs(fake_vocab, exc):
    llm = _FakeLlm([b"Hel", b"lo", b" wor", b"ld"], fail_at=2, exc=exc)
    edge = _backend(llm)
    got: list[str] = []
    with pytest.raises(EdgeError) as err:
        for delta in edge._run([1, 2, 3], GenerationParams(max_tokens=10), ()):
            got.append(delta.text)
    assert got == ["Hel", "lo"]
    text = str(err.value)
    assert type(exc).__name__ in text and "the answer is incomplete" in text, text
    assert "Retry the request" in text, text  # what to do
    assert err.value.__cause__ is exc
    # the backend is not left busy: the next generation answers in full
    deltas = list(edge._run([1, 2, 3], GenerationParams(max_tokens=10), ()))
    assert "".join(d.text for d in deltas) == "Hello world" and deltas[-1].finish_reason == "stop"


def test_a_stop_string_split_across_tokens_and_a_character_split_across_tokens(fake_vocab):
    edge = _backend(_FakeLlm([b"caf\xc3", b"\xa9\nUs", b"er", b": no"]))
    deltas = list(edge._run([1], GenerationParams(max_tokens=10), ("\nUser:",)))
    assert "".join(d.text for d in deltas) == "café"
    assert deltas[-1].finish_reason == "stop" and deltas[-1].usage.completion_tokens == 4


def test_two_threads_loading_at_once_keep_the_hook_llama_cpp_holds(monkeypatch):
    """Each thread saw no hook yet, made its own and set it (a ctypes call: the GIL is released);
    the last to return kept its hook referenced, while llama.cpp could hold the other one's
    pointer, freed with it."""
    monkeypatch.setattr(LL, "_LOG_HOOK", None)
    held: list[object] = []  # the hooks set, in order: llama.cpp holds the last
    barrier = threading.Barrier(2, timeout=1.0)

    def log_set(hook, user_data):
        held.append(hook)
        first = len(held) == 1
        try:
            barrier.wait()  # both threads inside at once (only without a lock around it)
        except threading.BrokenBarrierError:
            pass
        if first:
            time.sleep(0.2)  # the first to set it is the last to return

    monkeypatch.setattr(llama_cpp, "llama_log_set", log_set)
    threads = [threading.Thread(target=LL._route_llama_logs) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert held and held[-1] is LL._LOG_HOOK, "llama.cpp holds a hook nothing keeps alive"
    assert len(held) == 1


class _LoadedLlm:
    """A ``llama_cpp.Llama`` that loads: a model with no chat template."""

    instances: list[_LoadedLlm] = []

    def __init__(self, **kwargs) -> None:
        self.kwargs, self.closed = kwargs, False
        self._model = type("M", (), {"n_ctx_train": lambda self: 0, "vocab": None})()
        self._ctx = type("C", (), {"memory": object()})()
        self.metadata: dict = {}
        _LoadedLlm.instances.append(self)

    def close(self) -> None:
        self.closed = True


def test_a_model_refused_for_its_missing_chat_template_is_freed(monkeypatch, tmp_path):
    path = tmp_path / "m.gguf"
    monkeypatch.setattr(L, "resolve_gguf", lambda model, progress=None: ("m", path, None))
    monkeypatch.setattr(L, "_trained_context", lambda p: None)
    monkeypatch.setattr(L, "_route_llama_logs", lambda: None)
    monkeypatch.setattr(llama_cpp, "Llama", _LoadedLlm)
    _LoadedLlm.instances.clear()
    with pytest.raises(ModelCorruptError, match="has no chat template"):
        L.LlamaCppBackend(str(path), chat_format="template", n_threads=1)
    assert [llm.closed for llm in _LoadedLlm.instances] == [True]
