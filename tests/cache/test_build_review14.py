"""The cache's build side as a user meets it: a pairs file with a bad line, a data set too small to
split, a wrong option, and a reranker calibration that fails or is stopped part way."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hybridllm._exceptions import DataError, HybridLLMError
from hybridllm.cache import _reranker_calibration
from hybridllm.cache import train as train_mod
from hybridllm.cache import train_reranker as tr
from hybridllm.cache._reranker_weights import _write
from hybridllm.cache.evaluate import load_pairs
from hybridllm.cache.reranker_file import DEFAULT_NAME, NUM_STACK_INPUTS, Stack, read_info


def _write_lines(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


GOOD = {"text_a": "how do I cook rice?", "text_b": "how to cook rice", "label": 1}


@pytest.mark.parametrize("bad", [
    {**GOOD, "label": 2},  # was read as 1
    {**GOOD, "label": -1},  # was read as 1
    {**GOOD, "label": 0.7},  # was read as 0
    {**GOOD, "text_a": None},  # was the question "None"
    {**GOOD, "text_b": ""},
    '{"text_a": "a", "text_b": "b", "label": Infinity}',  # was an OverflowError traceback
    "[1, 2, 3]",
])
def test_a_bad_line_is_a_data_error_naming_it(tmp_path, bad):
    path = _write_lines(tmp_path / "pairs.jsonl", [GOOD, bad])
    with pytest.raises(DataError, match=r"pairs.jsonl:2: "):
        load_pairs(path)


def test_labels_written_as_bools_or_strings_still_read(tmp_path):
    rows = [{**GOOD, "label": v} for v in (True, False, "1", "0", 1.0, 0)]
    assert load_pairs(_write_lines(tmp_path / "p.jsonl", rows)).labels == [1, 0, 1, 0, 1, 0]


def test_a_file_that_is_not_utf8_is_a_data_error(tmp_path):
    path = tmp_path / "pairs.jsonl"
    line = json.dumps({**GOOD, "text_a": "caf\u00e9"}, ensure_ascii=False)
    path.write_bytes(line.encode("latin-1") + b"\n")
    with pytest.raises(DataError, match="not UTF-8"):  # was a UnicodeDecodeError traceback
        load_pairs(path)


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\n")
    assert load_pairs(path).text_a == [GOOD["text_a"]]


def _pairs_file(path: Path, n: int) -> Path:
    """``n`` pairs, each of two questions of its own (one component each), labels alternating."""
    return _write_lines(path, [
        {"text_a": f"question {i} first form", "text_b": f"question {i} second form", "label": i % 2}
        for i in range(n)
    ])


def _no_embedding(*args, **kwargs):
    raise AssertionError("embedded before the data or the options were checked")


def test_too_few_pairs_is_a_data_error_before_embedding(tmp_path, monkeypatch):
    monkeypatch.setattr(train_mod, "embed_texts", _no_embedding)
    data = _pairs_file(tmp_path / "pairs.jsonl", 3)  # a split is left empty
    with pytest.raises(DataError, match="split holds"):
        train_mod.train(data, tmp_path / "out", say=lambda _: None)


def test_an_out_that_cannot_be_a_folder_fails_before_the_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train_mod, "embed_texts", _no_embedding)
    data = _pairs_file(tmp_path / "pairs.jsonl", 60)
    out = tmp_path / "a-file"
    out.write_text("x")
    assert train_mod.main(["--data", str(data), "--out", str(out)]) == 1
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("main, option, value", [
    (train_mod.main, "--target-precision", "95"),  # meant 0.95: was a silent other threshold
    (train_mod.main, "--min-similarity", "2"),
    (tr.main, "--target-precision", "0"),
    (tr.main, "--batch-size", "0"),  # was a ZeroDivisionError after the embedding
    (tr.main, "--threads", "0"),
    (tr.main, "--lr", "-1"),
    (tr.main, "--epochs", "nan"),
])
def test_an_option_out_of_range_is_a_usage_error(tmp_path, capsys, main, option, value):
    with pytest.raises(SystemExit) as exc:
        main(["--data", str(tmp_path / "none.jsonl"), option, value])
    assert exc.value.code == 2
    assert option in capsys.readouterr().err


class _Stopped(Exception):
    pass


class _StoppedReranker:
    def __init__(self, *args, **kwargs):
        raise _Stopped  # as a Ctrl-C or a failed ONNX preparation, part way through calibrating


def _reranker_file(path: Path) -> bytes:
    n = NUM_STACK_INPUTS  # a stack of another width is a damaged file (read_info refuses it)
    stack = Stack(weights=np.ones(n), bias=0.1, mean=np.zeros(n), scale=np.ones(n), features_digest="f" * 16)
    _write(path, {"w:head.bias": np.zeros(1, np.float32)}, threshold=0.8, min_similarity=0.5,
           digest="d" * 16, metrics={"epochs": 1.0, "test_precision": 0.96}, stack=stack)
    return path.read_bytes()


def _fake_vectors(texts, **kwargs):
    return {t: np.ones(4, np.float32) / 2 for t in texts}


@pytest.mark.parametrize("calibrate_only", [True, False])
def test_a_stopped_calibration_leaves_the_reranker_file_as_it_was(tmp_path, monkeypatch, calibrate_only):
    monkeypatch.setattr(tr, "embed_texts", _fake_vectors)
    monkeypatch.setattr(_reranker_calibration, "Reranker", _StoppedReranker)  # looked up in _calibrate
    monkeypatch.setattr(tr, "fine_tune", lambda items, **kw: {"head.bias": np.full(1, 0.3, np.float32)})
    monkeypatch.setattr(tr, "_base_weights", dict)
    out = tmp_path / "out"
    out.mkdir()
    before = _reranker_file(out / DEFAULT_NAME)
    data = _pairs_file(tmp_path / "pairs.jsonl", 200)
    with pytest.raises(_Stopped):
        tr.train(data, out, calibrate_only=calibrate_only, say=lambda _: None)
    # the file the cache loads is still the calibrated one (was: threshold 0.5, no stack, no test metrics)
    assert (out / DEFAULT_NAME).read_bytes() == before
    assert read_info(out / DEFAULT_NAME).stack is not None
    interim = out / tr.UNCALIBRATED_NAME
    if calibrate_only:
        assert not interim.exists()
    else:  # the fine-tuned weights are not lost
        assert float(np.load(interim)["w:head.bias"][0]) == pytest.approx(0.3)


def test_calibrate_only_without_a_reranker_file_says_so_before_embedding(tmp_path, monkeypatch):
    monkeypatch.setattr(tr, "embed_texts", _no_embedding)
    data = _pairs_file(tmp_path / "pairs.jsonl", 200)
    with pytest.raises(HybridLLMError, match=DEFAULT_NAME):  # was a FileNotFoundError after embedding
        tr.train(data, tmp_path / "out", calibrate_only=True, say=lambda _: None)


def test_calibrate_only_does_not_need_torch(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    assert tr.main(["--data", str(tmp_path / "none.jsonl"), "--calibrate-only"]) == 2
    err = capsys.readouterr().err
    assert "torch" not in err and "none.jsonl" in err


class _FakeEmbedder:
    fingerprint = "fake-1"

    def __init__(self):
        self.calls = 0

    def embed(self, texts, progress=None):
        self.calls += 1
        return np.ones((len(texts), 4), np.float32) / 2


def test_a_damaged_embedding_cache_is_embedded_again(tmp_path, monkeypatch):
    from hybridllm.cache import embedder

    fake = _FakeEmbedder()
    monkeypatch.setattr(embedder, "get_embedder", lambda: fake)
    cache_file = tmp_path / "train" / "qqp-x.npz"
    train_mod.embed_texts(["a", "b"], cache_file=cache_file, say=lambda _: None)
    cache_file.write_bytes(cache_file.read_bytes()[:50])  # cut short (was a BadZipFile traceback)
    vecs = train_mod.embed_texts(["a", "b"], cache_file=cache_file, say=lambda _: None)
    assert fake.calls == 2 and sorted(vecs) == ["a", "b"]
    vecs = train_mod.embed_texts(["a", "b"], cache_file=cache_file, say=lambda _: None)
    assert fake.calls == 2  # written whole again


def test_the_threshold_meets_the_target_when_probabilities_tie():
    # 100 pairs at 0.9 (96 right), then 20 at 0.8 (10 right): a threshold of 0.8 takes all 20, at
    # precision 0.88; it was chosen when the 0.8 run's right pairs were sorted first
    probs = np.array([0.9] * 100 + [0.8] * 20)
    labels = np.array([1] * 96 + [0] * 4 + [1] * 10 + [0] * 10)
    t = train_mod.choose_threshold(probs, np.ones(120), labels, min_similarity=0.5, target=0.95)
    assert t == 0.9
    assert labels[probs >= t].mean() >= 0.95
