"""Decode steps through CUDA graph buckets: the padding is checked on CPU (the same padded forward
without a capture); the capture itself runs where CUDA is (skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

from cloud_server.engine.cuda_graph import MIN_CONTEXT, MIN_ROWS, DecodeGraphs

pytestmark = pytest.mark.real

PROMPTS = [
    "Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox",
    "List the primary colours.",
    "def add(a, b):\n    return a + b\n\nRewrite add with type hints.",
]


def test_buckets_pad_rows_and_context_to_powers_of_two():
    graphs = DecodeGraphs(None, torch.zeros(1), 0, max_rows=20, max_context=3000, capture=False)
    assert (graphs.max_rows, graphs.max_context) == (32, 4096)
    assert graphs.bucket(1, 5) == (MIN_ROWS, MIN_CONTEXT)
    assert graphs.bucket(9, 129) == (16, 256)
    assert graphs.bucket(32, 4096) == (32, 4096)
    assert graphs.bucket(33, 10) is None  # more rows than the largest bucket: eager
    assert graphs.bucket(8, 4097) is None  # a longer window than max_context: eager


def _engine(path, *, device="cpu", **kw):
    from cloud_server.config import EngineConfig
    from cloud_server.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(
        str(path), device=device, dtype="float32", quantization="none", max_model_len=512,
        kv_cache_memory_bytes=64 << 20, speculative_method="ngram", **kw))


def _generate(engine, max_tokens=24):
    from cloud_server.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.token_ids for o in engine.generate(PROMPTS, params)]


def test_padded_decode_steps_match_eager_steps_and_write_only_the_scratch_block(smollm2_path):
    eager, padded = _engine(smollm2_path), _engine(smollm2_path)
    assert eager.runner.graphs is None  # CPU: no graphs by default
    r = padded.runner
    scratch = padded.block_manager.num_blocks * padded.config.block_size
    r.graphs = DecodeGraphs(r.model, r.kv_cache, scratch, max_rows=32, max_context=512, capture=False)
    want, got = _generate(eager), _generate(padded)
    assert got == want
    assert r.graphs.num_graphs >= 1  # decode steps (and verify rows) went through the buckets
    # every real slot holds what the eager engine wrote (padded rows wrote the scratch block only)
    real = slice(0, scratch)
    torch.testing.assert_close(r.kv_cache[:, :, :, real], eager.runner.kv_cache[:, :, :, real],
                               rtol=1e-4, atol=1e-4)
    assert r.kv_cache[:, :, :, scratch:].abs().sum() > 0
    assert eager.runner.kv_cache[:, :, :, scratch:].abs().sum() == 0


def test_a_failed_capture_falls_back_to_eager_steps(smollm2_path, caplog):
    """A capture that raises (here: no CUDA device to capture on) costs its bucket the graph, not
    the step: the engine answers as without graphs and logs the failure once."""
    eager, fallback = _engine(smollm2_path), _engine(smollm2_path)
    r = fallback.runner
    scratch = fallback.block_manager.num_blocks * fallback.config.block_size
    r.graphs = DecodeGraphs(r.model, r.kv_cache, scratch, max_rows=32, max_context=512, capture=True)
    if torch.cuda.is_available():
        r.graphs._capture = lambda g: (_ for _ in ()).throw(RuntimeError("capture refused"))
    with caplog.at_level("WARNING", logger="cloud_server.engine.cuda_graph"):
        assert _generate(fallback) == _generate(eager)
    failures = [rec for rec in caplog.records if "capture" in rec.getMessage()]
    assert r.graphs.num_graphs == 0 and len(failures) == len(r.graphs._failed) >= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graph_decode_matches_eager_on_cuda(smollm2_path):
    eager = _engine(smollm2_path, device="cuda", enforce_eager=True)
    graphed = _engine(smollm2_path, device="cuda")
    assert eager.runner.graphs is None and graphed.runner.graphs is not None
    want, got = _generate(eager, 48), _generate(graphed, 48)
    assert graphed.runner.graphs.num_graphs >= 1
    same = sum(a == b for a, b in zip(want, got, strict=True))
    assert same == len(PROMPTS), f"{len(PROMPTS) - same} of {len(PROMPTS)} outputs differ"


def test_the_start_up_line_says_where_the_model_runs(smollm2_engine):
    """``describe()`` feeds the server's "model ... ready" log line: device, dtype, quantization,
    and on CUDA whether decode steps replay graphs."""
    from types import SimpleNamespace

    from cloud_server.engine.llm_engine import LLMEngine

    text = smollm2_engine.describe()
    dtype = str(smollm2_engine.dtype).removeprefix("torch.")
    assert text.startswith(f"{smollm2_engine.device}, {dtype}, quantization ")
    assert ("CUDA graphs on" in text) == (smollm2_engine.runner.graphs is not None)
    # the CUDA wording, checked without a CUDA device: the same engine as seen on "cuda", with and
    # without graphs (this engine runs on CPU, where the line names no graphs at all)
    for graphs, want in ((None, "CUDA graphs off"), (object(), "CUDA graphs on")):
        on_cuda = SimpleNamespace(
            device=torch.device("cuda"), dtype=smollm2_engine.dtype,
            quantization=smollm2_engine.quantization, runner=SimpleNamespace(graphs=graphs),
            spec=smollm2_engine.spec,
        )
        line = LLMEngine.describe(on_cuda)  # type: ignore[arg-type]
        assert line.startswith(f"cuda, {dtype}, quantization ") and want in line, line
    if smollm2_engine.device.type == "cpu":
        assert "CUDA graphs" not in text
