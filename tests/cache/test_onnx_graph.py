"""The torch-free ONNX graphs against the PyTorch reference exported by torch.onnx, on real questions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hybridllm.cache.evaluate import load_pairs

pytestmark = pytest.mark.real


def _session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _feeds(tokenizer, inputs: list, batch: int = 50):
    """Padded ``[batch, seq]`` int64 feeds, ``batch`` inputs at a time."""
    for start in range(0, len(inputs), batch):
        encs = tokenizer.encode_batch(inputs[start : start + batch])
        width = max(len(e.ids) for e in encs)
        ids = np.zeros((len(encs), width), dtype=np.int64)
        mask, types = np.zeros_like(ids), np.zeros_like(ids)
        for row, e in enumerate(encs):
            ids[row, : len(e.ids)], mask[row, : len(e.ids)], types[row, : len(e.ids)] = e.ids, 1, e.type_ids
        yield {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def _run(session, feeds) -> np.ndarray:
    return np.concatenate([session.run(None, feed)[0] for feed in feeds])


def test_embedder_graph_agrees_with_the_torch_export(
    tmp_path: Path, minilm_dir: Path, shared_data: Path
) -> None:
    pytest.importorskip("torch")
    import onnx
    from tokenizers import Tokenizer

    from hybridllm.cache import onnx_graph
    from hybridllm.cache.export import build_torch_model, export_onnx

    pairs = load_pairs(shared_data / "paraphrase" / "qqp_pairs.jsonl", limit=100)
    questions = pairs.text_a + pairs.text_b  # 200 real questions
    onnx.save(
        onnx_graph.sentence_encoder(
            onnx_graph.read_config(minilm_dir), onnx_graph.read_base_weights(minilm_dir)
        ),
        str(tmp_path / "ours.onnx"),
    )
    export_onnx(build_torch_model(minilm_dir), tmp_path / "torch.onnx")
    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tok.enable_truncation(256)
    ours = _run(_session(tmp_path / "ours.onnx"), _feeds(tok, questions))
    ref = _run(_session(tmp_path / "torch.onnx"), _feeds(tok, questions))
    assert ours.shape == ref.shape == (200, 384)
    cos = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() >= 0.999, cos.min()
    # not a degenerate encoder: a question and an unrelated one are far apart
    assert float(ours[0] @ ours[1]) < 0.9


def test_reranker_graph_agrees_with_the_torch_export(
    tmp_path: Path, minilm_dir: Path, shared_data: Path
) -> None:
    pytest.importorskip("torch")
    import onnx
    from tokenizers import Tokenizer

    from hybridllm.cache import onnx_graph
    from hybridllm.cache.export import build_cross_encoder, export_onnx
    from hybridllm.cache.reranker_file import cross_encoder_weights, default_path

    pairs = load_pairs(shared_data / "paraphrase" / "qqp_pairs.jsonl", limit=200)
    inputs = list(zip(pairs.text_b, pairs.text_a, strict=True))
    cfg = onnx_graph.read_config(minilm_dir)
    onnx.save(
        onnx_graph.cross_encoder(cfg, cross_encoder_weights(default_path(), minilm_dir)),
        str(tmp_path / "ours.onnx"),
    )
    export_onnx(build_cross_encoder(minilm_dir, default_path()), tmp_path / "torch.onnx")
    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tok.enable_truncation(128)
    ours = _run(_session(tmp_path / "ours.onnx"), _feeds(tok, inputs))
    ref = _run(_session(tmp_path / "torch.onnx"), _feeds(tok, inputs))
    assert ours.shape == ref.shape == (200,)
    np.testing.assert_allclose(ours, ref, atol=1e-3)
    labels = np.asarray(pairs.labels)
    # the logits carry the fine-tuning: same-question pairs score higher on average
    assert ours[labels == 1].mean() > ours[labels == 0].mean() + 1.0
