"""`hybridllm cache eval` and the verifier training commands as a user building a cache meets
them: a pairs file that leaves a rate undefined, a question that is not text, a cache or output
folder that cannot be written, a bad seed, and Ctrl-C part way through a write."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from hybridllm import cli
from hybridllm._exceptions import DataError
from hybridllm.cache import semantic
from hybridllm.cache import train as train_mod
from hybridllm.cache import train_reranker as tr
from hybridllm.cache._reranker_weights import _write
from hybridllm.cache.evaluate import load_pairs, pair_metrics
from hybridllm.cache.verifier import HitVerifier

from .fakes import FakeEmbedder


def _write_lines(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def _pairs_file(path: Path, n: int) -> Path:
    return _write_lines(path, [
        {"text_a": f"question {i} first form", "text_b": f"question {i} second form", "label": i % 2}
        for i in range(n)
    ])


def test_a_rate_with_nothing_to_divide_by_is_undefined_not_a_number() -> None:
    """Before: no hits gave precision 1.0 and no positives recall 0.0, figures that look measured."""
    m = pair_metrics([False, False], [0, 0])
    assert m["precision"] is None and m["recall"] is None and m["false_hit_rate"] == 0.0
    m = pair_metrics([True, False], [1, 1])
    assert m["precision"] == 1.0 and m["recall"] == 0.5 and m["false_hit_rate"] is None


@pytest.fixture
def fake_eval_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """`cache eval` through the real SemanticCache, with the bag-of-words embedder (no model)."""
    real = semantic.SemanticCache

    def with_fake_embedder(*args, **kwargs):
        return real(*args, embedder=FakeEmbedder(), **kwargs)

    monkeypatch.setattr(semantic, "SemanticCache", with_fake_embedder)


def test_eval_of_pairs_with_no_positive_says_recall_is_undefined(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_eval_cache: None
) -> None:
    """Before: "recall=0.000" (and a JSON 0.0) for a file with no pair labelled 1."""
    pairs = _write_lines(tmp_path / "p.jsonl", [
        {"text_a": "how do I cook rice", "text_b": "how do I cook rice", "label": 0},
        {"text_a": "what is the capital of France", "text_b": "best pizza in town", "label": 0},
    ])
    args = ["cache", "eval", "--pairs", str(pairs), "--verifier", "cosine"]
    assert cli.main([*args, "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["recall"] is None and metrics["positives"] == 0 and metrics["n"] == 2
    assert metrics["hits"] == 1 and metrics["precision"] == 0.0 and metrics["false_hit_rate"] == 0.5
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "recall=undefined" in out and "recall is undefined: no pair is labelled 1" in out


def test_a_lone_surrogate_in_a_question_is_a_data_error_naming_the_line(tmp_path: Path) -> None:
    """Before: the file loaded; `cache eval` failed at that pair, after embedding all before it,
    with a message that named neither the file nor the line."""
    good = {"text_a": "how do I cook rice?", "text_b": "how to cook rice", "label": 1}
    half_an_emoji = '{"text_a": "hi \\ud83d", "text_b": "hi", "label": 1}'
    path = _write_lines(tmp_path / "pairs.jsonl", [good, half_an_emoji])
    with pytest.raises(DataError, match=r"pairs.jsonl:2: .*surrogate"):
        load_pairs(path)


class _Embedder:
    fingerprint = "fake"

    def embed(self, texts, *, progress=None):
        return FakeEmbedder().embed(texts)


def test_embeddings_that_cannot_be_kept_are_still_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a cache dir that cannot be written failed the training with an OSError after the
    whole embedding (about 15 minutes for the shipped pairs)."""
    monkeypatch.setattr("hybridllm.cache.embedder.get_embedder", lambda: _Embedder())
    blocker = tmp_path / "a file"
    blocker.write_text("")
    said: list[str] = []
    vecs = train_mod.embed_texts(["a b", "c d"], cache_file=blocker / "train" / "x.npz", say=said.append)
    assert sorted(vecs) == ["a b", "c d"] and vecs["a b"].shape == (384,)
    assert any("not keeping the embeddings" in s for s in said)


def _interrupted_save(file, *args, **kwargs):
    Path(file).write_bytes(b"PK\x03\x04 half a zip")
    raise KeyboardInterrupt


def test_ctrl_c_while_writing_leaves_the_old_files_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the temporary file stayed beside the output (the embeddings' is ~150 MB, never
    removed), one for each interrupted run."""
    target = tmp_path / "cache_verifier.npz"
    target.write_bytes(b"old")
    monkeypatch.setattr(np, "savez_compressed", _interrupted_save)
    monkeypatch.setattr(np, "savez", _interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        train_mod.save_verifier(HitVerifier.load(), target)
    with pytest.raises(KeyboardInterrupt):
        _write(tmp_path / "cache_reranker.npz", {}, threshold=0.5, min_similarity=0.5, digest="d",
               metrics={})
    monkeypatch.setattr("hybridllm.cache.embedder.get_embedder", lambda: _Embedder())
    with pytest.raises(KeyboardInterrupt):
        train_mod.embed_texts(["a b"], cache_file=tmp_path / "emb.npz", say=lambda _: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache_verifier.npz"]
    assert target.read_bytes() == b"old"


def test_an_undefined_rate_is_written_to_the_reranker_file_as_nan(tmp_path: Path) -> None:
    """With no hit on the test split the precision is undefined: the file must still be written
    (a TypeError there would lose the fine-tuning just done)."""
    path = tmp_path / "r.npz"
    _write(path, {}, threshold=0.5, min_similarity=0.5, digest="d",
           metrics={"test_precision": None, "test_recall": 0.0})
    with np.load(path) as data:
        assert list(data["metric_names"]) == ["test_precision", "test_recall"]
        assert np.isnan(data["metric_values"][0]) and data["metric_values"][1] == 0.0


def _no_embedding(*args, **kwargs):
    raise AssertionError("embedded before the output folder was checked")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self: a folder no one can write")
@pytest.mark.parametrize("module", [train_mod, tr])
def test_an_output_folder_that_cannot_be_written_fails_before_the_embedding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module
) -> None:
    """Before: an existing read-only --out passed the mkdir check; the training ran (for the reranker
    a fine-tuning of 15 minutes and more) and its result was lost at the write."""
    monkeypatch.setattr(module, "embed_texts", _no_embedding)
    data = _pairs_file(tmp_path / "pairs.jsonl", 300)
    with pytest.raises(OSError):
        module.train(data, Path("/proc/self"), say=lambda _: None)


@pytest.mark.parametrize("seed", ["-1", str(2**32), "x"])
def test_a_seed_scikit_learn_refuses_is_refused_before_anything_runs(
    seed: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: --seed -1 was taken, and the boosted trees refused it after the embedding, as a
    traceback."""
    monkeypatch.setattr(train_mod, "train", _no_embedding)
    with pytest.raises(SystemExit) as exit_:
        train_mod.main(["--data", "pairs.jsonl", "--seed", seed])
    assert exit_.value.code == 2 and "--seed" in capsys.readouterr().err


@pytest.mark.parametrize("module", [train_mod, tr])
def test_ctrl_c_during_training_is_one_line_not_a_traceback(
    module, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "train", interrupted)
    argv = ["--data", "pairs.jsonl"] + ([] if module is train_mod else ["--calibrate-only"])  # no torch
    try:
        assert module.main(argv) == 130
    except KeyboardInterrupt:  # pytest would take it for the user's own Ctrl-C and stop the run
        pytest.fail("KeyboardInterrupt came out of main() (a traceback for the user)")
    assert "interrupted" in capsys.readouterr().err
