"""The reranker's logit range (:mod:`hybridllm.cache.logit_bound`) against brute force on a tiny
synthetic cross-encoder (hidden size 8, random weights; its fp32 and int8 graphs built as the real
ones are): every logit of random and adversarial inputs lies inside it, and the fp32 range is
tight. Fast: no model files, graphs of a few kB."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hybridllm.cache import onnx_graph
from hybridllm.cache.logit_bound import logit_range
from hybridllm.cache.prepare import quantize

N, VOCAB, SEQ = 8, 40, 12


def _weights(rng: np.random.Generator, layers: int) -> dict[str, np.ndarray]:
    def r(*shape: int, scale: float = 0.5) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {
        "encoder.word.weight": r(VOCAB, N, scale=2.0),
        "encoder.position.weight": np.zeros((SEQ, N), np.float32),
        "encoder.token_type.weight": np.zeros((2, N), np.float32),
        "encoder.emb_norm.weight": r(N, scale=1.5),
        "encoder.emb_norm.bias": r(N),
        "head.weight": r(1, N, scale=1.0),
        "head.bias": r(1),
    }
    for i in range(layers):
        p = f"encoder.layers.{i}."
        for name, (o, k) in {"query": (N, N), "key": (N, N), "value": (N, N), "attn_out": (N, N),
                             "up": (2 * N, N), "down": (N, 2 * N)}.items():
            w[f"{p}{name}.weight"], w[f"{p}{name}.bias"] = r(o, k), r(o)
        for name in ("attn_norm", "out_norm"):
            w[f"{p}{name}.weight"], w[f"{p}{name}.bias"] = r(N, scale=1.5), r(N)
    return w


def _graphs(tmp_path: Path, weights: dict[str, np.ndarray], layers: int) -> tuple[Path, Path]:
    import onnx

    cfg = {"hidden_size": N, "num_attention_heads": 2, "num_hidden_layers": layers,
           "intermediate_size": 2 * N, "layer_norm_eps": 1e-12}
    fp32, int8 = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    onnx.save(onnx_graph.cross_encoder(cfg, weights), str(fp32))
    quantize(fp32, int8)
    return fp32, int8


def _run(path: Path, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return session.run(None, feeds)[0]


def _inputs(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
    ids = rng.integers(0, VOCAB, size=(rows, SEQ), dtype=np.int64)
    lengths = rng.integers(1, SEQ + 1, size=rows)
    mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int64)
    return ids, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_range_is_brute_forces_extremes_and_holds_them(tmp_path: Path, seed: int) -> None:
    """No layers: the last LayerNorm reads the word embeddings, which the test sets to the input
    that maximizes (and minimizes) the logit, ``LN(x)`` along ``P(w * gamma)``. The fp32 logits
    of those inputs reach the range's ends, within its float margin; no input of either graph
    leaves it (the int8 one's wider by the rounding of the pooled vector)."""
    rng = np.random.default_rng(seed)
    w = _weights(rng, layers=0)
    gamma, beta = w["encoder.emb_norm.weight"].astype(np.float64), w["encoder.emb_norm.bias"]
    head = w["head.weight"][0].astype(np.float64)
    u = head * gamma
    u -= u.mean()  # P(w * gamma): LN's output has mean 0
    w["encoder.word.weight"][0] = u * 3.0  # LN(token 0) = sqrt(n) u / |u|: the highest logit
    w["encoder.word.weight"][1] = -u * 3.0  # the lowest
    fp32, int8 = _graphs(tmp_path, w, layers=0)
    lo, hi = logit_range(fp32)
    lo8, hi8 = logit_range(int8)
    assert lo8 <= lo < hi <= hi8

    # brute force: the reference optimum, sqrt(n) |P(w * gamma)| about w . beta + b
    center = float(head @ beta + w["head.bias"][0])
    radius = np.sqrt(N) * np.linalg.norm(u)
    assert lo <= center - radius and center + radius <= hi
    assert hi - lo < 2 * radius * 1.01 + 0.01  # tight: only the float margin added

    ids, mask = _inputs(rng, 400)
    ids[:50], ids[50:100] = 0, 1  # the extremes, alone (every length)
    for path, (low, high) in ((fp32, (lo, hi)), (int8, (lo8, hi8))):
        logits = _run(path, ids, mask)
        assert np.all((low <= logits) & (logits <= high)), (path.name, logits.min(), logits.max(), low, high)
    logits = _run(fp32, ids[:100], mask[:100])
    np.testing.assert_allclose(logits[:50], center + radius, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(logits[50:], center - radius, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("seed", [3, 4])
def test_the_range_holds_through_layers_for_random_inputs(tmp_path: Path, seed: int) -> None:
    """Two layers before the pooled LayerNorm: whatever they do, the logits stay inside."""
    rng = np.random.default_rng(seed)
    fp32, int8 = _graphs(tmp_path, _weights(rng, layers=2), layers=2)
    ids, mask = _inputs(rng, 500)
    for path in (fp32, int8):
        low, high = logit_range(path)
        logits = _run(path, ids, mask)
        assert np.all((low <= logits) & (logits <= high)), (path.name, logits.min(), logits.max(), low, high)


def test_a_graph_of_another_shape_has_no_range(tmp_path: Path) -> None:
    """Not a reranker (the embedder's graph), or not a file: None, and every pair is scored."""
    import onnx

    rng = np.random.default_rng(5)
    w = {k.removeprefix("encoder."): v for k, v in _weights(rng, layers=0).items()}
    cfg = {"hidden_size": N, "num_attention_heads": 2, "num_hidden_layers": 0, "intermediate_size": 2 * N}
    onnx.save(onnx_graph.sentence_encoder(cfg, w), str(tmp_path / "emb.onnx"))
    assert logit_range(tmp_path / "emb.onnx") is None
    (tmp_path / "bad.onnx").write_bytes(b"not a graph")
    assert logit_range(tmp_path / "bad.onnx") is None
    assert logit_range(tmp_path / "missing.onnx") is None
