"""The ONNX backend refuses an unknown chat_format as the llama.cpp backend does (helper-f4,
review 16), before anything is prepared or loaded."""

from __future__ import annotations

import pytest

from hybridllm import ConfigError


@pytest.mark.parametrize("chat_format", ["chatml", "llama-2", "", "Template", 1])
def test_unknown_chat_format_is_the_same_config_error_on_both_backends(chat_format):
    """Before: OnnxBackend(chat_format="chatml") (a llama-cpp-python name) loaded and silently
    rendered every conversation as the plain completion transcript, a prompt the model was not
    tuned on. The model id is never looked at: the check comes first."""
    from hybridllm.backends.llama_cpp import LlamaCppBackend
    from hybridllm.backends.onnx import OnnxBackend

    with pytest.raises(ConfigError) as llama:
        LlamaCppBackend("no-such-model", chat_format=chat_format)
    with pytest.raises(ConfigError) as onnx:
        OnnxBackend("no-such-model", chat_format=chat_format)
    assert str(onnx.value) == str(llama.value)
    assert str(onnx.value).startswith("chat_format must be 'template'")


@pytest.mark.parametrize("setting", [{"precison": "fp32"}, {"n_thread": 2}, {"temperature": 0}])
def test_an_unknown_setting_is_refused_with_its_name(setting):
    """Before: **_unused took any name, so a misspelt precision= or n_threads= was dropped without
    a word (the default int4 model loaded, on every core)."""
    from hybridllm.backends.onnx import OnnxBackend

    with pytest.raises(ConfigError, match=rf"OnnxBackend got unknown settings: {next(iter(setting))}\."):
        OnnxBackend("no-such-model", **setting)


def test_the_llama_cpp_only_settings_are_still_taken():
    """A config shared with llama.cpp may pass n_batch and verbose: they reach the model lookup."""
    from hybridllm import ModelNotFoundError
    from hybridllm.backends.onnx import OnnxBackend

    with pytest.raises(ModelNotFoundError):
        OnnxBackend("no-such-model", n_batch=256, verbose=True)
