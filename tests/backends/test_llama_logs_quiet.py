"""llama.cpp's log lines stay off stderr unless ``verbose=True``: its default printer let through
ERROR-level advice such as Gemma 3's "using full-size SWA cache" on every load, a stray line under
`hybridllm ask`'s clean output. They go to the ``hybridllm.llama_cpp`` logger at DEBUG instead."""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.real


def test_a_gemma3_load_writes_nothing_to_stderr_and_logs_at_debug(gemma3_path, capfd, caplog):
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    with caplog.at_level(logging.DEBUG, logger="hybridllm.llama_cpp"):
        backend = LlamaCppBackend("gemma3-270m", n_ctx=2048)
        backend.close()
    err = capfd.readouterr().err
    assert "SWA" not in err and "llama_" not in err, err
    lines = [r.getMessage() for r in caplog.records if r.name == "hybridllm.llama_cpp"]
    assert any("full-size SWA cache" in line for line in lines), lines[-5:]
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == "hybridllm.llama_cpp")


def test_verbose_still_prints_llama_cpp_lines(smollm2_path, capfd):
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    backend = LlamaCppBackend("smollm2-135m-instruct", n_ctx=512, verbose=True)
    backend.close()
    assert "llama_model_loader" in capfd.readouterr().err
