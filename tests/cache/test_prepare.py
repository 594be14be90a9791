"""Preparing the cache's ONNX models on a device: no torch, quiet, atomic under concurrent processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.real

NO_TORCH = "import sys; sys.modules['torch'] = None\n"  # `import torch` -> ImportError

RACER = NO_TORCH + (
    "from pathlib import Path; from hybridllm.cache.prepare import prepare_embedder\n"
    "prepare_embedder(source_dir=Path(sys.argv[1]), out_dir=Path(sys.argv[2]))\n"
)


def test_concurrent_prepares_are_serialized_and_atomic(tmp_path: Path, minilm_dir: Path) -> None:
    from hybridllm.cache.prepare import FP32_NAME, INT8_NAME, is_prepared

    out = tmp_path / "embedder"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(minilm_dir), str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    logs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), logs
    # the lock makes the second process find the work done instead of building again
    assert sum("Preparing the semantic cache embedder (once) ..." in err for _, err in logs) == 1, logs
    assert is_prepared(out)
    assert not list(out.glob("*.tmp")), "temporary files left behind"

    import onnxruntime as ort

    for name in (FP32_NAME, INT8_NAME):
        session = ort.InferenceSession(str(out / name), providers=["CPUExecutionProvider"])
        ids = np.array([[101, 7592, 2088, 102]], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": 0 * ids}
        (vec,) = session.run(None, feed)
        assert vec.shape == (1, 384) and abs(float(np.linalg.norm(vec)) - 1.0) < 1e-3


FIRST_USE = NO_TORCH + (
    "import logging\n"
    "from hybridllm.cache.embedder import Embedder\n"
    "from hybridllm.cache.reranker import get_rerank_verifier\n"
    "vec = Embedder().embed_one('What is the capital of France?')\n"
    "verifier = get_rerank_verifier()\n"
    "p = verifier.reranker.probs(['How do I learn Python?'], ['How can I learn Python?'])\n"
    "print(type(verifier).__name__, vec.shape[0], round(float(vec @ vec), 3), float(p[0]) > 0.5)\n"
    "print('root handlers', len(logging.getLogger().handlers))\n"
)


def test_first_use_without_torch_prints_only_progress_lines(tmp_path: Path, minilm_dir: Path) -> None:
    """Empty data dir, torch unimportable: the embedder and the reranker are built, with one line
    each on stderr and no third-party warning (ONNX Runtime's quantizer logs through the root logger)."""
    env = dict(os.environ, HYBRIDLLM_HOME=str(tmp_path / "home"))
    done = subprocess.run(
        [sys.executable, "-c", FIRST_USE], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["RerankVerifier 384 1.0 True", "root handlers 0"], done.stdout
    lines = done.stderr.splitlines()
    assert [line.split(" done in ")[0] for line in lines] == [
        "Preparing the semantic cache embedder (once) ...",
        "Preparing the semantic cache reranker (once) ...",
    ], done.stderr
    assert all(line.endswith(" s") for line in lines), done.stderr
    # a second run finds the files and says nothing
    again = subprocess.run(
        [sys.executable, "-c", FIRST_USE], env=env, capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0 and again.stderr == "", again.stderr


def test_reranker_that_cannot_be_prepared_falls_back_to_the_feature_verifier(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from hybridllm._exceptions import ModelError
    from hybridllm.cache import get_embedder, reranker
    from hybridllm.cache.verifier import HitVerifier

    def broken(*_args: object, **_kwargs: object) -> Path:
        raise ModelError("Preparing the cache model failed: no onnx here")

    # a paraphrase the feature verifier serves by a margin (0.97 against its threshold 0.954;
    # "How do I learn Python?" / "How can I learn Python?" scores 0.937 since the 2026-12-02 refit)
    queries = ["What is the best way to learn Python?", "What is the best way to learn Python?"]
    cached = ["What's the best way to learn Python?", "What is the capital of France?"]
    vecs = get_embedder().embed(queries[:1] + cached)
    capsys.readouterr()  # the embedder's own first-use line, if this session had not prepared it
    monkeypatch.setattr(reranker, "prepare_reranker", broken)
    monkeypatch.setattr(reranker, "_shared", {})
    verifier = reranker.get_rerank_verifier()
    assert capsys.readouterr().err == ""  # nothing is prepared before a candidate needs scoring
    probs = verifier.predict(queries, cached, vecs[[0, 0]], vecs[1:])
    features = HitVerifier.load()
    expected = features.predict(queries, cached, vecs[[0, 0]], vecs[1:])
    assert probs[0] == pytest.approx(expected[0]) and probs[0] >= features.threshold  # the paraphrase
    assert probs[1] < features.threshold  # the other question
    assert verifier.kind == "features" and verifier.threshold == features.threshold
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "uses the feature verifier instead" in err[0] and "no onnx here" in err[0]
    verifier.predict(queries, cached, vecs[[0, 0]], vecs[1:])
    assert capsys.readouterr().err == ""  # said once
    with pytest.raises(ModelError):  # a file the caller named is not silently replaced
        reranker.RerankVerifier.load(reranker.default_path())


def test_an_embedder_that_cannot_be_prepared_fails_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridllm._exceptions import ModelError
    from hybridllm.cache import embedder

    calls = []

    def broken(*_args: object, **_kwargs: object) -> Path:
        calls.append(1)
        raise ModelError("Preparing the cache model failed: no onnx here")

    monkeypatch.setattr(embedder, "prepare_embedder", broken)
    monkeypatch.setattr(embedder, "_shared", {})
    monkeypatch.setattr(embedder, "_failed", {})
    with pytest.raises(ModelError, match="no onnx here") as first:
        embedder.get_embedder()
    with pytest.raises(ModelError) as second:
        embedder.get_embedder()
    assert second.value is first.value and len(calls) == 1  # not tried (nor announced) again


def test_a_data_dir_that_cannot_be_written_is_a_model_error(tmp_path: Path, minilm_dir: Path) -> None:
    """Before: the raw FileExistsError / PermissionError escaped the cache's lookup (which steps
    aside only on a HybridLLMError) and failed the whole request in a read-only HYBRIDLLM_HOME."""
    from hybridllm._exceptions import ModelError
    from hybridllm.cache.prepare import prepare_embedder

    blocker = tmp_path / "home"
    blocker.write_text("not a folder")
    with pytest.raises(ModelError, match="HYBRIDLLM_HOME"):
        prepare_embedder(source_dir=minilm_dir, out_dir=blocker / "embedders" / "minilm-l6-v2")
