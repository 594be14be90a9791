"""The hit verifier: features, safe file format, and the shipped model on held-out QQP pairs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hybridllm._exceptions import CacheError, DataError
from hybridllm.cache.evaluate import load_pairs, pair_metrics
from hybridllm.cache.features import HANDCRAFTED, NUM_HANDCRAFTED, Idf, handcrafted, pair_features
from hybridllm.cache.verifier import HitVerifier, Trees, default_path


def _feature(query: str, cached: str, name: str) -> float:
    return handcrafted(query, cached, 0.9)[HANDCRAFTED.index(name)]


def test_surface_features_catch_what_cosine_misses() -> None:
    assert (
        _feature("Best laptop under 500 dollars?", "Best laptop under 800 dollars?", "number_mismatch") == 1
    )
    assert _feature("Is coffee bad for you?", "Is coffee not bad for you?", "negation_mismatch") == 1
    assert _feature("Why is Python slow?", "How is Python slow?", "question_word_differs") == 1
    assert _feature("How do I move to Canada?", "How do I move to Germany?", "capitalized_only_one") == 2
    assert _feature("How do I learn Python?", "How do I learn Python fast?", "content_only_cached") == 1
    assert _feature("How do I learn Python?", "how do i learn python", "exact_match") == 1


def test_pair_features_shape_and_symmetric_parts() -> None:
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((4, 384)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    x = pair_features(["a b", "c d"], ["a", "c e"], vecs[:2], vecs[2:])
    assert x.shape == (2, NUM_HANDCRAFTED + 768) and x.dtype == np.float32
    np.testing.assert_allclose(x[:, 0], (vecs[:2] * vecs[2:]).sum(1), rtol=1e-5)
    with pytest.raises(ValueError):
        pair_features(["a"], ["b", "c"], vecs[:1], vecs[1:3])


def test_exported_trees_match_scikit_learn_and_roundtrip(tmp_path: Path) -> None:
    from sklearn.ensemble import HistGradientBoostingClassifier

    from hybridllm.cache.train import save_verifier, trees_from_sklearn

    rng = np.random.default_rng(1)
    n = NUM_HANDCRAFTED + 768
    x = rng.standard_normal((600, n)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 3] - x[:, 500] > 0).astype(int)
    mean, scale = x.mean(0), x.std(0)
    w = rng.standard_normal(n).astype(np.float32) * 0.01
    linear = (w, 0.1, mean, scale)
    verifier = HitVerifier(
        Trees(
            *(np.zeros(1, dt) for dt in (np.int32, float, np.int32, np.int32, float, bool)),
            roots=np.zeros(1, np.int32),
            baseline=0.0,
        ),
        idf=Idf(["python"], [3.0], 5.0),
        linear=linear,
        threshold=0.7,
        min_similarity=0.5,
        metrics={"test_precision": 0.96},
    )
    tree_x = verifier.tree_inputs(x)
    gbt = HistGradientBoostingClassifier(max_iter=30, random_state=0).fit(tree_x, y)
    verifier.trees = trees_from_sklearn(gbt)
    np.testing.assert_allclose(verifier.predict_features(x), gbt.predict_proba(tree_x)[:, 1], atol=1e-6)
    path = save_verifier(verifier, tmp_path / "v.npz")
    loaded = HitVerifier.load(path)
    np.testing.assert_allclose(loaded.predict_features(x), verifier.predict_features(x), atol=1e-6)
    assert loaded.threshold == 0.7 and loaded.metrics == {"test_precision": 0.96}
    assert loaded.idf("python") == 3.0 and loaded.idf("never-seen") == 5.0
    with np.load(path, allow_pickle=False) as data:  # plain arrays only, no object pickles
        assert all(data[k].dtype != object for k in data.files)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(CacheError):
        HitVerifier.load(tmp_path / "bad.npz")


def test_shipped_verifier_is_safe_and_sane() -> None:
    verifier = HitVerifier.load(default_path())
    assert 0.0 < verifier.threshold < 1.0 and verifier.linear is not None
    assert len(verifier.linear[0]) == NUM_HANDCRAFTED + 768
    with np.load(default_path(), allow_pickle=False) as data:  # plain arrays, no objects
        assert not any(data[k].dtype == object for k in data.files)
    # its quality is measured, not read back from the file: test_shipped_verifier_on_held_out_qqp_pairs


def test_pair_metrics_and_bad_pairs_file(tmp_path: Path) -> None:
    m = pair_metrics([True, True, False, True], [1, 0, 1, 1])
    assert m["precision"] == 2 / 3 and m["recall"] == 2 / 3 and m["false_hit_rate"] == 1.0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text_a": "x"}\n')
    with pytest.raises(DataError, match="text_a, text_b and label"):
        load_pairs(bad)


@pytest.mark.real
def test_shipped_verifier_on_held_out_qqp_pairs(features_on_held_out: dict) -> None:
    """The feature verifier (``verifier="features"``) on unseen test-split pairs: the session's
    3,000-pair sample (``held_out_qqp``), the one the reranker is compared with, measured once for
    both tests. Before, 2,000 pairs of their own (45 hits) were embedded for this test alone (31 s
    in CI); the 3,000 give 46 hits (precision 1.0, recall 0.041, false-hit rate 0.0)."""
    metrics = features_on_held_out
    print(json.dumps(metrics))
    # ~45 hits in a sample this size: precision is loose here, the false-hit rate is not
    assert metrics["false_hit_rate"] <= 0.005, metrics
    assert metrics["precision"] >= 0.90, metrics
    assert metrics["recall"] >= 0.03, metrics


@pytest.mark.real
def test_cli_eval_prints_one_json_object(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from hybridllm.cli import main

    rows = [
        ("How do I learn Python?", "How do I learn Python?", 1),
        ("What is the capital of France?", "What is France's capital city?", 1),
        ("How do I learn Python?", "How do I cook rice?", 0),
        ("Best laptop under 500 dollars?", "Best laptop under 2000 dollars?", 0),
        ("Who wrote Hamlet?", "Who wrote Macbeth?", 0),
        ("extra line beyond the limit", "not read", 1),
    ]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"text_a": a, "text_b": b, "label": y}) + "\n" for a, b, y in rows))
    assert main(["cache", "eval", "--pairs", str(pairs), "--limit", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n"] == 5 and out["positives"] == 2
    assert {"precision", "recall", "false_hit_rate"} <= set(out)
    assert out["recall"] >= 0.5  # the identical pair is always a hit
    assert main(["cache", "eval", "--pairs", str(tmp_path / "missing.jsonl"), "--json"]) == 1


@pytest.mark.parametrize("which", ["verifier", "reranker"])
def test_a_missing_shipped_file_says_the_install_is_incomplete(tmp_path, monkeypatch, which):
    """Before: a wheel without cache_verifier.npz / cache_reranker.npz was an 'internal error'."""
    import hybridllm._paths as paths
    from hybridllm import HybridLLMError
    from hybridllm.cache.reranker_file import read_info

    (tmp_path / "catalog.json").write_text("{}")
    monkeypatch.setattr(paths, "assets_dir", lambda: tmp_path)
    load = HitVerifier.load if which == "verifier" else read_info
    with pytest.raises(HybridLLMError, match="install is incomplete"):
        load()
