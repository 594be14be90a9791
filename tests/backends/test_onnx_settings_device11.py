"""The ONNX backend takes n_ctx and n_threads by the llama.cpp backend's rules: the same errors for
the same bad values (before anything is prepared or loaded), and n_ctx=0 is the model's own length."""

from __future__ import annotations

import logging

import pytest

from hybridllm import ConfigError, GenerationParams

BAD = [
    {"n_ctx": -1},
    {"n_ctx": 2.5},
    {"n_ctx": "4096"},
    {"n_threads": 0},
    {"n_threads": -2},
    {"n_threads": 10**6},
    {"n_threads": True},
]


@pytest.mark.parametrize("settings", BAD, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_bad_settings_are_the_same_config_error_on_both_backends(settings):
    """Before: OnnxBackend(n_ctx=-1) loaded and then refused every prompt ("the device model's
    context holds -1"), n_ctx="4096" failed with a TypeError inside min(), and n_threads=-2 was
    reported as a corrupt folder. The model id is never looked at: the check comes first."""
    from hybridllm.backends.llama_cpp import LlamaCppBackend
    from hybridllm.backends.onnx import OnnxBackend

    with pytest.raises(ConfigError) as llama:
        LlamaCppBackend("no-such-model", **settings)
    with pytest.raises(ConfigError) as onnx:
        OnnxBackend("no-such-model", **settings)
    assert str(onnx.value) == str(llama.value)


def test_n_ctx_zero_without_a_length_in_the_folder_says_what_to_pass(tmp_path):
    from hybridllm.backends.onnx_folder import _context_size

    assert _context_size(0, 8192, tmp_path) == 8192
    assert _context_size(512, 8192, tmp_path) == 512
    with pytest.raises(ConfigError, match="pass n_ctx"):
        _context_size(0, 0, tmp_path)


def test_n_ctx_past_the_models_length_is_cut_with_a_warning(tmp_path, caplog):
    from hybridllm.backends.onnx_folder import _context_size

    with caplog.at_level(logging.WARNING, logger="hybridllm.edge"):
        assert _context_size(10_000, 8192, tmp_path) == 8192
    assert "n_ctx=10000 is more than" in caplog.text


@pytest.mark.real
def test_n_ctx_zero_is_the_models_own_context_and_answers(onnx_folder):
    """Before: OnnxBackend(n_ctx=0), the llama.cpp backend's "the model's own length", made a
    context of 0 tokens: every prompt was refused as too long."""
    from hybridllm.backends.onnx import OnnxBackend

    edge = OnnxBackend(str(onnx_folder), n_ctx=0, n_threads=1)
    try:
        assert edge.context_length > 1000  # SmolLM2's own length, read from genai_config.json
        out = edge.generate([{"role": "user", "content": "Say hi."}],
                            GenerationParams(max_tokens=3, temperature=0.0))
        assert out.usage.completion_tokens > 0
    finally:
        edge.close()


@pytest.fixture(scope="module")
def onnx_folder():
    pytest.importorskip("onnxruntime_genai")
    from hybridllm.models.onnx_prepare import prepare_onnx

    return prepare_onnx("smollm2-135m-instruct")


@pytest.mark.real
def test_closed_half_way_says_the_answer_is_incomplete_as_on_llama_cpp(onnx_folder):
    """Before: an ONNX stream whose backend was closed after its first token raised "The ONNX
    backend is closed; create a new OnnxBackend", not saying that the answer read so far was cut
    short; the llama.cpp backend says "closed while it was generating; the answer is incomplete"."""
    from hybridllm import EdgeError
    from hybridllm.backends.onnx import OnnxBackend

    edge = OnnxBackend(str(onnx_folder), n_ctx=256, n_threads=1)
    stream = edge.stream([{"role": "user", "content": "Count from one to twenty."}],
                         GenerationParams(max_tokens=30, temperature=0.0))
    first = next(stream)
    assert first.finish_reason is None
    edge.close()
    with pytest.raises(EdgeError, match="closed while it was generating; the answer is incomplete"):
        list(stream)
    with pytest.raises(EdgeError, match="The ONNX backend is closed; create a new OnnxBackend"):
        edge.stream([{"role": "user", "content": "Hi."}], GenerationParams(max_tokens=3))
