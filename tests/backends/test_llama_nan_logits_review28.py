"""A GGUF whose weights make NaN logits is an EdgeError on llama.cpp, as on ONNX, never an answer.

llama.cpp's samplers pick a token from a NaN row all the same: greedy kept the first
(SmolLM2's <|endoftext|>: an empty answer with finish_reason "stop"), a sampled draw wrote
"........"; the ONNX backend raised "The model produced NaN logits" for the same damage.
"""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm import EdgeError, GenerationParams

pytestmark = pytest.mark.real
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def nan_model(smollm2_path, tmp_path_factory):
    gguf = pytest.importorskip("gguf")  # the server's extra: only this test needs it
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    path = tmp_path_factory.mktemp("nan") / "nan.gguf"
    path.write_bytes(smollm2_path.read_bytes())
    reader = gguf.GGUFReader(str(path), "r+")
    norm = next(t for t in reader.tensors if t.name == "output_norm.weight")
    norm.data[:] = np.nan  # a damaged norm: every hidden state, so every logit, is NaN
    del reader
    backend = LlamaCppBackend(str(path), n_ctx=128, n_threads=1)
    yield backend
    backend.close()
    path.unlink()  # a 100 MB copy


@pytest.mark.parametrize("params", [
    GenerationParams(temperature=0.0, max_tokens=8),
    GenerationParams(temperature=0.8, seed=1, max_tokens=8),
    GenerationParams(temperature=0.0, max_tokens=8, logprobs=True),
], ids=["greedy", "sampled", "logprobs"])
def test_nan_logits_are_an_error_not_an_answer(nan_model, params):
    with pytest.raises(EdgeError, match=r"NaN logits \(49152 of 49152\)"):
        nan_model.generate(FRANCE, params)
    # the backend stays usable for the next request (which fails the same way, not otherwise)
    with pytest.raises(EdgeError, match="NaN logits"):
        nan_model.generate(FRANCE, params)
