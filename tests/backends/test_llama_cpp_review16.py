"""The llama.cpp backend used directly: its exit hook, and GGUFs it cannot generate with."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from hybridllm import ModelCorruptError


def _write(path, arch: str, tensors: dict, **kv) -> str:
    gguf = pytest.importorskip("gguf")  # the server's extra: only these tests need it
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        getattr(w, f"add_{key}")(value)
    rng = np.random.default_rng(0)
    for name, shape in tensors.items():
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_an_architecture_llama_cpp_does_not_know_is_named_and_not_blamed_on_the_download(tmp_path):
    """Was: "(Failed to load model from file: ...). The file is truncated, corrupt or of an
    unsupported architecture. Download it again": the reason (in llama.cpp's log) was lost, and
    downloading a whole file again cannot help."""
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    path = _write(tmp_path / "m.gguf", "nosucharch", {"token_embd.weight": (4, 8)},
                  block_count=1, context_length=64, embedding_length=8)
    with pytest.raises(ModelCorruptError) as err:
        LlamaCppBackend(path, n_ctx=64, n_threads=1)
    text = str(err.value)
    assert "unknown model architecture: 'nosucharch'" in text, text
    assert "cannot run models of that architecture" in text and "again" not in text, text


def test_a_damaged_file_says_what_llama_cpp_found(tmp_path):
    """A file of a known architecture that lacks a setting: llama.cpp's reason is in the message,
    with the advice for a damaged file as before."""
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    path = _write(tmp_path / "m.gguf", "llama", {"token_embd.weight": (4, 8)},
                  block_count=1, context_length=64, embedding_length=8)
    with pytest.raises(ModelCorruptError) as err:
        LlamaCppBackend(path, n_ctx=64, n_threads=1)
    text = str(err.value)
    assert "key not found in model: llama.attention.layer_norm_rms_epsilon" in text, text
    assert "truncated, corrupt" in text, text


def _tiny_bert(path) -> str:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [chr(97 + i) for i in range(11)]
    E, F, C = 8, 16, 32
    tensors = {"token_embd.weight": (len(vocab), E), "token_types.weight": (2, E),
               "position_embd.weight": (C, E), "token_embd_norm.weight": (E,),
               "token_embd_norm.bias": (E,), "blk.0.attn_output_norm.weight": (E,),
               "blk.0.attn_output_norm.bias": (E,), "blk.0.ffn_up.weight": (F, E),
               "blk.0.ffn_up.bias": (F,), "blk.0.ffn_down.weight": (E, F), "blk.0.ffn_down.bias": (E,),
               "blk.0.layer_output_norm.weight": (E,), "blk.0.layer_output_norm.bias": (E,)}
    for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
        tensors[f"blk.0.{n}.weight"], tensors[f"blk.0.{n}.bias"] = (E, E), (E,)
    return _write(path, "bert", tensors, context_length=C, embedding_length=E,
                  feed_forward_length=F, block_count=1, head_count=2, layer_norm_eps=1e-12,
                  causal_attention=False,
                  pooling_type=pytest.importorskip("gguf").PoolingType.MEAN,
                  tokenizer_model="bert", token_type_count=2, token_list=vocab,
                  token_types=[3] * 5 + [1] * (len(vocab) - 5), bos_token_id=2, eos_token_id=3,
                  unk_token_id=1, sep_token_id=3, pad_token_id=0)


def test_an_embedding_model_is_refused_at_load(tmp_path):
    """An encoder-only GGUF (BERT) loads in llama.cpp without a KV cache: the backend was made,
    and its first answer raised llama-cpp-python's bare AssertionError "Memory is not
    initialized"."""
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    with pytest.raises(ModelCorruptError, match=r"embedding model \(architecture 'bert'\)"):
        LlamaCppBackend(_tiny_bert(tmp_path / "bert.gguf"), n_ctx=32, n_threads=1)


_EXIT_MID_ANSWER = """
import atexit, sys, threading, time
decoding, chunks = threading.Event(), [0]
def still_decoding():  # registered before hybridllm's exit hooks, so it runs after them
    seen = chunks[0]
    time.sleep(0.5)  # SmolLM2 decodes about 15 tokens in this time on two cores
    print("decoding at teardown:", chunks[0] - seen > 2, flush=True)
atexit.register(still_decoding)
from hybridllm import EdgeError, GenerationParams
from hybridllm.backends.llama_cpp import LlamaCppBackend
edge = LlamaCppBackend(sys.argv[1], n_ctx=1024)
def answer():
    try:
        for _ in edge.stream([{"role": "user", "content": "Write a long story about a dragon."}],
                             GenerationParams(max_tokens=400)):
            chunks[0] += 1
            decoding.set()
    except EdgeError as exc:
        print("reader:", exc, flush=True)
threading.Thread(target=answer, daemon=True).start()
decoding.wait(60)  # the main thread ends while the backend decodes; it is never closed
print("decoding at exit:", decoding.is_set(), flush=True)
"""


@pytest.mark.real
def test_a_backend_used_directly_stops_decoding_at_exit(smollm2_path, tmp_path):
    """A LlamaCppBackend used without HybridLLM (so without its worker's exit hook): an app that
    ends mid-answer went on decoding on its daemon thread while the interpreter tore llama.cpp
    down (the crash at exit the worker's hook fixed for the client). Now the backend is closed at
    exit, the running answer stopped after its current token and its reader told why."""
    script = tmp_path / "app.py"
    script.write_text(_EXIT_MID_ANSWER)
    out = subprocess.run([sys.executable, str(script), str(smollm2_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "decoding at exit: True" in out.stdout, (out.stdout, out.stderr[-2000:])
    assert "decoding at teardown: False" in out.stdout, (out.stdout, out.stderr[-2000:])
    assert "reader: The llama.cpp backend was closed while it was generating" in out.stdout, out.stdout


def test_the_trained_length_is_read_from_the_header_past_its_arrays(tmp_path, smollm2_path):
    from hybridllm.backends.llama_cpp_load import _trained_context

    assert _trained_context(smollm2_path) == 8192  # its tokenizer arrays come first
    path = _write(tmp_path / "m.gguf", "llama", {"token_embd.weight": (4, 8)}, token_list=["a", "bb"],
                  token_scores=[0.5, 0.25], block_count=1, context_length=77, embedding_length=8)
    assert _trained_context(tmp_path / "m.gguf") == 77 and path
    (tmp_path / "cut.gguf").write_bytes((tmp_path / "m.gguf").read_bytes()[:40])
    assert _trained_context(tmp_path / "cut.gguf") is None


@pytest.mark.real
def test_a_context_past_the_trained_length_is_never_made(smollm2_path, monkeypatch):
    """n_ctx=65536 on SmolLM2 (trained on 8192): the context was made at 65536 (1.6 GB of KV cache,
    peak), then made again at 8192; n_ctx=10**6 failed as "too little memory" instead of being cut."""
    import llama_cpp

    from hybridllm.backends.llama_cpp import LlamaCppBackend

    asked: list[int] = []
    real = llama_cpp.Llama

    def recording(*args, **kwargs):
        asked.append(kwargs["n_ctx"])
        return real(*args, **kwargs)

    monkeypatch.setattr(llama_cpp, "Llama", recording)
    edge = LlamaCppBackend(str(smollm2_path), n_ctx=10**6, n_threads=1)
    try:
        assert asked == [8192] and edge.context_length == 8192
    finally:
        edge.close()
