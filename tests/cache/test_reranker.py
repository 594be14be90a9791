"""The cross-encoder reranker: safe file format, export parity, and held-out QQP pairs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hybridllm._exceptions import CacheError, ConfigError
from hybridllm.cache import get_embedder
from hybridllm.cache.evaluate import PairSet, evaluate_pairs, load_pairs
from hybridllm.cache.features import NUM_HANDCRAFTED
from hybridllm.cache.reranker import RerankVerifier, get_rerank_verifier, load_stacked_features
from hybridllm.cache.reranker_file import FORMAT, VERSION, default_path, read_info, read_weights
from hybridllm.cache.semantic import SemanticCache, load_verifier
from hybridllm.cache.train_reranker import pack_weights, weights_digest
from hybridllm.cache.verifier import HitVerifier


def _write_file(path: Path, **fields: np.ndarray) -> Path:
    base = {
        "format": np.array(FORMAT),
        "version": np.array(VERSION),
        "threshold": np.array(0.5),
        "min_similarity": np.array(0.5),
        "weights_digest": np.array("0123456789abcdef"),
    }
    base.update(fields)
    np.savez(path, **base)
    return path


def test_packed_weights_round_trip_as_low_rank_changes() -> None:
    rng = np.random.default_rng(0)
    name = "encoder.layers.0.query.weight"
    base = {name: rng.standard_normal((40, 30)).astype(np.float32)}
    change = np.outer(rng.standard_normal(40), rng.standard_normal(30)).astype(np.float32)  # rank 1
    weights = {
        name: base[name] + change,
        "encoder.layers.0.query.bias": rng.standard_normal(40).astype(np.float32),
        "encoder.position.weight": rng.standard_normal((5, 4)).astype(np.float32),
        "head.weight": rng.standard_normal((1, 4)).astype(np.float32),
    }
    arrays = pack_weights(weights, base, rank=4)
    assert arrays[f"u:{name}"].dtype == np.int8 and arrays[f"u:{name}"].shape == (40, 4)  # int8 factors
    assert arrays[f"v:{name}"].shape == (4, 30)
    assert "w:encoder.position.weight" in arrays and "w:head.weight" in arrays  # the rest: float32
    back = read_weights_from(arrays, base)
    # a rank-1 change survives a rank-4 factorization up to int8 rounding of its factors
    assert np.abs(back[name] - weights[name]).max() <= 0.02 * np.abs(change).max()
    with pytest.raises(CacheError, match="base weight"):
        read_weights_from(arrays, None)
    for name in ("encoder.layers.0.query.bias", "encoder.position.weight", "head.weight"):
        np.testing.assert_array_equal(back[name], weights[name])
    digest = weights_digest(arrays)
    arrays["w:head.weight"] = arrays["w:head.weight"] + 1.0
    assert weights_digest(arrays) != digest


def read_weights_from(arrays: dict[str, np.ndarray], base: dict | None) -> dict[str, np.ndarray]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = _write_file(Path(tmp) / "r.npz", **arrays)
        return read_weights(path, base)


def test_reranker_file_errors_are_clear(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip file at all")
    with pytest.raises(CacheError, match="Cannot read the cache reranker"):
        read_info(garbage)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, x=np.zeros(3))
    with pytest.raises(CacheError, match="not a hybridllm cache reranker"):
        read_info(foreign)
    future = _write_file(tmp_path / "future.npz", version=np.array(VERSION + 1))
    with pytest.raises(CacheError, match="train_reranker"):
        read_info(future)
    empty = _write_file(tmp_path / "empty.npz")
    assert read_info(empty).threshold == 0.5
    with pytest.raises(CacheError, match="no reranker weights"):
        read_weights(empty)
    with pytest.raises(ConfigError, match="neither one of"):
        load_verifier(tmp_path / "missing.npz")
    k = 2 + NUM_HANDCRAFTED
    stack = {"stack_w": np.ones(k), "stack_b": np.array(0.0), "stack_mean": np.zeros(k),
             "stack_scale": np.ones(k), "features_digest": np.array("not-the-shipped-one")}
    stale = _write_file(tmp_path / "stale.npz", **stack)
    with pytest.raises(CacheError, match="recalibrate"):
        load_stacked_features(read_info(stale))


def test_shipped_reranker_file_is_safe_and_complete() -> None:
    info = read_info(default_path())
    assert 0.0 < info.threshold < 1.0 and 0.0 <= info.min_similarity < 1.0
    with np.load(default_path(), allow_pickle=False) as data:  # plain arrays, no objects
        assert not any(data[k].dtype == object for k in data.files)
    assert info.stack is not None and len(info.stack.weights) == 2 + NUM_HANDCRAFTED
    # its quality is measured, not read back from the file: test_shipped_reranker_on_held_out_qqp_pairs


@pytest.mark.real
def test_onnx_export_matches_pytorch_and_int8_agrees(minilm_dir: Path, shared_data: Path) -> None:
    import torch

    from hybridllm.cache.export import build_cross_encoder
    from hybridllm.cache.reranker import Reranker

    pairs = load_pairs(shared_data / "paraphrase" / "qqp_pairs.jsonl", limit=300)
    queries, cached = pairs.text_b, pairs.text_a
    fp32 = Reranker(quantized=False, num_threads=2)
    int8 = Reranker(quantized=True, num_threads=2)
    onnx_fp32 = fp32.logits(queries, cached)

    model = build_cross_encoder(minilm_dir, default_path())
    tok = fp32._tokenizer
    with torch.no_grad():
        for i in range(0, 40):
            enc = tok.encode(queries[i], cached[i])
            ids = torch.tensor([enc.ids])
            logit = model(ids, torch.ones_like(ids), torch.tensor([enc.type_ids]))
            assert float(logit) == pytest.approx(float(onnx_fp32[i]), abs=1e-3)

    p32 = 1 / (1 + np.exp(-onnx_fp32))
    p8 = int8.probs(queries, cached)
    threshold = read_info().threshold
    agree = np.mean((p32 >= threshold) == (p8 >= threshold))
    print(json.dumps({"mean_abs_prob_diff": float(np.abs(p32 - p8).mean()), "decision_agreement": agree}))
    assert np.abs(p32 - p8).mean() < 0.03 and agree >= 0.97


@pytest.mark.real
def test_shipped_reranker_on_held_out_qqp_pairs(
    held_out_qqp: tuple[PairSet, dict[str, np.ndarray]], features_on_held_out: dict
) -> None:
    """The cache's own protocol on a 3,000-pair sample of the test split (never trained on); its
    texts are embedded once (the session's ``held_out_qqp``), as each lookup would embed them."""
    subset, vectors = held_out_qqp
    metrics = evaluate_pairs(subset, vectors=vectors)  # the default verifier: the reranker
    print(json.dumps(metrics))
    # about 100 hits in a sample this size: a precision standard error of about 2 points
    assert metrics["precision"] >= 0.91 and metrics["false_hit_rate"] <= 0.01, metrics
    assert metrics["recall"] > features_on_held_out["recall"], (metrics, features_on_held_out)


@pytest.mark.real
def test_cache_with_the_reranker_serves_paraphrases_not_near_misses(tmp_path: Path) -> None:
    assert isinstance(load_verifier("default"), RerankVerifier)
    assert isinstance(load_verifier("features"), HitVerifier)
    assert load_verifier("cosine") is None
    assert load_verifier(default_path()) is get_rerank_verifier(default_path())
    with SemanticCache(tmp_path / "c.sqlite3") as cache:
        assert cache.stats()["verifier"] == "reranker"
        cache.put([{"role": "user", "content": "How can I improve my English?"}], "Read and speak daily.",
                  model="m", params_key={})
        asked = [{"role": "user", "content": "How do I improve my English?"}]
        hit = cache.get(asked, model="m", params_key={})
        assert hit is not None and hit.text == "Read and speak daily." and hit.verifier_prob is not None
        for near_miss in ("How can I improve my French?", "How can I improve my English accent in a week?"):
            assert cache.get([{"role": "user", "content": near_miss}], model="m", params_key={}) is None


@pytest.mark.real
def test_training_command_writes_a_file_the_cache_loads(
    tmp_path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few steps of real fine-tuning on 300 QQP pairs, exported, stacked and scored by ONNX Runtime."""
    from hybridllm.cache import embedder as embedder_module
    from hybridllm.cache import reranker as reranker_module
    from hybridllm.cache.train_reranker import main

    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "data"))  # keep the prepared ONNX files here
    # this test's own process-wide embedder: one made here points into tmp_path, which is deleted
    # after the test, and later tests in the process would load it from there
    monkeypatch.setattr(embedder_module, "_shared", {})
    monkeypatch.setattr(embedder_module, "_failed", {})
    monkeypatch.setattr(reranker_module, "_shared", {})
    pairs = load_pairs(shared_data / "paraphrase" / "qqp_pairs.jsonl", limit=300)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(
        json.dumps({"text_a": a, "text_b": b, "label": y}) + "\n"
        for a, b, y in zip(pairs.text_a, pairs.text_b, pairs.labels, strict=True)
    ))
    out = tmp_path / "out"
    assert main(["--data", str(data), "--out", str(out), "--epochs", "0.1", "--threads", "2"]) == 0
    info = read_info(out / "cache_reranker.npz")
    assert info.metrics["test_n"] + info.metrics["val_n"] < 300 and 0.0 <= info.threshold <= 1.0
    assert info.stack is not None
    assert (tmp_path / "data" / "rerankers").is_dir()
    verifier = load_verifier(out / "cache_reranker.npz")
    queries = ["How do I learn Python?", "How do I learn Python?"]
    cached = ["How can I learn Python?", "What is the capital of France?"]
    vecs = get_embedder().embed(queries[:1] + cached)
    probs = verifier.predict(queries, cached, vecs[[0, 0]], vecs[1:])
    assert probs.shape == (2,) and probs[0] > probs[1] + 0.2  # the paraphrase, well above the other
    # recalibrating keeps the weights and refits the stack
    assert main(["--data", str(data), "--out", str(out), "--calibrate-only"]) == 0
    assert read_info(out / "cache_reranker.npz").weights_digest == info.weights_digest
    assert main(["--data", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2


HARD_NEGATIVES = [
    ("Is it safe to eat raw chicken?", "Is it unsafe to eat raw chicken?"),
    ("Is ibuprofen safe during pregnancy?", "Is ibuprofen not safe during pregnancy?"),
    ("Should I take aspirin with alcohol?", "Should I not take aspirin with alcohol?"),
    ("Convert 5 km to miles", "Convert 5 miles to km"),
    ("Flights from Paris to London", "Flights from London to Paris"),
    ("Is a dolphin bigger than a shark?", "Is a shark bigger than a dolphin?"),
    ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?"),
    ("Is 17 a prime number?", "Is seventeen a prime number?"),
    ("What is 5!", "What is 5?"),
    ("What does this print?\nfor i in range(3):\n    print(i)\nprint('done')",
     "What does this print?\nfor i in range(3):\n    print(i)\n    print('done')"),
    ("Is x = 1 or X = 1 valid Python?", "is x = 1 or x = 1 valid python?"),
]


@pytest.mark.real
@pytest.mark.parametrize("verifier", ["default", "features", "cosine"])
def test_no_verifier_serves_the_hard_negatives(tmp_path: Path, verifier: str) -> None:
    """Before: the reranker served "unsafe" for "safe" (p 0.96), the feature verifier "a shark
    bigger than a dolphin" for the reverse, plain cosine all of them, and all three the last three
    (as exact repeats: case, whitespace and a trailing "!" were normalized away)."""
    with SemanticCache(tmp_path / "c.sqlite3", verifier=verifier) as cache:
        for i, (cached, asked) in enumerate(HARD_NEGATIVES):
            ns = f"pair-{i}"
            cache.put([{"role": "user", "content": cached}], "A", model="m", params_key={}, namespace=ns)
            hit = cache.get([{"role": "user", "content": asked}], model="m", params_key={}, namespace=ns)
            assert hit is None, (cached, asked, hit)
        # what stays a hit: the same question in other words, or another case and spacing
        asked = "What is the best way to learn Python?"
        cache.put([{"role": "user", "content": asked}], "B", model="m", params_key={})
        for again in ("what is the best way to learn python", "What's the best way to learn Python?"):
            hit = cache.get([{"role": "user", "content": again}], model="m", params_key={})
            assert hit is not None and hit.text == "B", again
