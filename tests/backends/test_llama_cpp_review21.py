"""The llama.cpp backend with a fake model (review 21): no model is loaded.

- The same prompt got two answers at temperature 0: a prompt new to the KV cache was decoded in one
  batch, a repeat of it (or of a prompt cut short by a closed stream) had its last token decoded
  again alone, and llama.cpp's logits differ in the last bits between the two (SmolLM2 alternated
  between two greedy answers, request after request).
- A GGUF whose header holds a damaged length (a flipped top bit) raised a bare OverflowError from
  the header reader before llama.cpp could name the damaged file and how to replace it.
"""

from __future__ import annotations

import ctypes
import struct
import threading

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

import hybridllm.backends.llama_cpp as L  # noqa: E402
import hybridllm.backends.llama_cpp_load as LL  # noqa: E402
from hybridllm import GenerationParams, ModelCorruptError  # noqa: E402

EOS = 99


class _Ctx:
    def kv_cache_seq_rm(self, seq: int, start: int, end: int) -> bool:
        return True

    def get_logits(self):  # finite: the backend reads the drawn token's own (a NaN one is refused)
        return (ctypes.c_float * 128)()


class _BatchSensitiveLlm:
    """A ``llama_cpp.Llama`` whose next token depends on how the last decode was batched, as
    llama.cpp's logits do in their last bits: 1 ("a") after a decode of one token, 2 ("b") after a
    larger batch. ``generate`` is llama-cpp-python's own (its cache reuse is what is tested)."""

    verbose = False
    draft_model = None

    def __init__(self, n_ctx: int = 64) -> None:
        self._n_ctx = n_ctx
        self.input_ids = np.zeros(n_ctx, dtype=np.intc)
        self.n_tokens = 0
        self._requires_eval = True
        self._ctx = _Ctx()
        self._model = type("M", (), {"vocab": None})()
        self._is_recurrent = self._is_hybrid = False
        self.batches: list[int] = []

    @property
    def _input_ids(self):
        return self.input_ids[: self.n_tokens]

    def set_seed(self, seed: int) -> None:
        pass

    def _init_sampler(self, **kw):
        return None

    def reset(self) -> None:
        self.n_tokens = 0
        self._requires_eval = True

    def eval(self, tokens) -> None:
        if len(tokens):
            self.batches.append(len(tokens))
            self.input_ids[self.n_tokens : self.n_tokens + len(tokens)] = tokens
            self.n_tokens += len(tokens)
            self._requires_eval = False

    def sample(self, idx=None, **kw) -> int:
        return 1 if self.batches[-1] == 1 else 2

    def generate(self, tokens, **kw):
        return llama_cpp.Llama.generate(self, tokens, **kw)


@pytest.fixture
def fake_vocab(monkeypatch):
    monkeypatch.setattr(llama_cpp.llama_cpp, "llama_vocab_is_eog", lambda vocab, tok: tok == EOS)
    monkeypatch.setattr(L, "llama_bytes", lambda llm, ids, special=False:
                        b"".join({1: b"a", 2: b"b"}.get(i, b"?") for i in ids))


def _backend(llm) -> L.LlamaCppBackend:
    b = L.LlamaCppBackend.__new__(L.LlamaCppBackend)
    b._busy, b._gate, b._llm, b._n_ctx, b._n_vocab = threading.Lock(), L._Gate(), llm, llm._n_ctx, 100
    b.n_threads = 1
    return b


def _answer(edge, prompt, n=3) -> str:
    return "".join(d.text for d in edge._run(prompt, GenerationParams(max_tokens=n, temperature=0), ()))


def test_a_prompt_gets_the_same_answer_new_to_the_cache_and_repeated(fake_vocab):
    llm = _BatchSensitiveLlm()
    edge = _backend(llm)
    a, b = [5, 6, 7, 8], [5, 6, 9]
    answers = [_answer(edge, p) for p in (a, a, b, a, b, b)]
    assert answers == ["aaa"] * 6, answers


def test_a_stream_closed_half_way_leaves_the_next_answer_as_a_fresh_one(fake_vocab):
    llm = _BatchSensitiveLlm()
    edge = _backend(llm)
    first = _answer(edge, [5, 6, 7, 8], n=5)
    stream = edge._run([5, 6, 7, 8], GenerationParams(max_tokens=5, temperature=0), ())
    next(stream)
    stream.close()
    assert _answer(edge, [5, 6, 7, 8], n=5) == first == "aaaaa"


def test_the_cached_prefix_is_kept_and_only_the_new_tokens_are_decoded(fake_vocab):
    llm = _BatchSensitiveLlm()
    edge = _backend(llm)
    _answer(edge, [5, 6, 7, 8], n=1)
    llm.batches.clear()
    _answer(edge, [5, 6, 7, 8, 10, 11, 12], n=1)
    # 8 (cached), then 10 and 11 together, then 12 alone
    assert llm.batches == [2, 1], llm.batches
    llm.batches.clear()
    _answer(edge, [5], n=1)  # a one-token prompt: decoded alone, the cache cut to nothing
    assert llm.batches == [1] and llm.n_tokens == 1


def _gguf_with_key_length(tmp_path, length: int):
    path = tmp_path / "damaged.gguf"
    # magic, version 3, 0 tensors, 1 metadata pair whose key claims `length` bytes
    path.write_bytes(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, length) + b"general.architecture")
    return path


@pytest.mark.parametrize("length", [2**63 + 5, 2**64 - 1])
def test_a_damaged_length_in_the_header_is_left_to_llama_cpp(tmp_path, length):
    assert LL._trained_context(_gguf_with_key_length(tmp_path, length)) is None


class _RefusingLlm:
    def __init__(self, **kwargs) -> None:
        raise ValueError(f"Failed to load model from file: {kwargs['model_path']}")


def test_a_damaged_header_is_one_model_corrupt_error_naming_the_file(monkeypatch, tmp_path):
    path = _gguf_with_key_length(tmp_path, 2**63 + 5)
    monkeypatch.setattr(L, "resolve_gguf", lambda model, progress=None: ("damaged", path, None))
    monkeypatch.setattr(L, "_route_llama_logs", lambda: None)
    monkeypatch.setattr(llama_cpp, "Llama", _RefusingLlm)
    with pytest.raises(ModelCorruptError) as err:
        L.LlamaCppBackend(str(path), n_threads=1)
    assert str(path) in str(err.value) and "truncated, corrupt" in str(err.value)
