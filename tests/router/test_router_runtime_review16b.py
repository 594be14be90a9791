"""Run-time router defects found in review 16b: a weights file that is one bare array, prompts
that are not strings in score_texts, a rounding-level gap in evaluate, damaged embedding caches."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm._exceptions import DataError, InvalidRequestError, RouterFileError
from hybridllm.router import embedding_cache
from hybridllm.router.evaluate import router_metrics
from hybridllm.router.features import EMBEDDING_DIM
from hybridllm.router.router import load_router

from .fakes import length_router


def test_weights_file_holding_one_bare_array_is_a_router_file_error(tmp_path):
    """np.save'd into weights.npz (np.load gives an array, not an archive): was a TypeError
    ('does not support the context manager protocol'), now a RouterFileError naming the file."""
    folder = length_router().save(tmp_path / "r")
    with (folder / "weights.npz").open("wb") as fh:
        np.save(fh, np.zeros(3))
    with pytest.raises(RouterFileError, match=r"weights\.npz is corrupt.*re-copy"):
        load_router(folder)


@pytest.mark.parametrize("bad", [None, 5, b"bytes", {"role": "user", "content": "hi"},
                                 [{"role": "user", "content": "hi"}]])
def test_score_texts_refuses_a_prompt_that_is_not_a_string(bad):
    r = length_router()
    with pytest.raises(InvalidRequestError, match=r"texts\[1\] is .*use score\(\)"):
        r.score_texts(["a question", bad])
    assert r.score_texts(["a question", "another"]).shape == (2,)  # strings still score


def test_a_gap_of_rounding_is_no_gap():
    """The same values in another order: their two means may differ in the last bit, and APGR
    divided by that difference came out -1.7e14; now the 'strong is not more accurate' error."""
    weak = np.array([0.8, 0.6, 0.7, 0.3])  # graded labels: mean 0.5999999999999999
    strong = weak[::-1].copy()  # mean 0.6000000000000001
    assert strong.mean() > weak.mean()  # the case: means that differ by rounding alone
    with pytest.raises(DataError, match="not more accurate"):
        router_metrics([0.1, 0.2, 0.3, 0.4], weak, strong)
    # a real gap, however small a share, still gives the metrics
    m = router_metrics([0.1, 0.9] * 500, [0.0] * 1000, [0.0] * 999 + [1.0])
    assert np.isfinite(m["apgr"]) and 0.0 <= m["calls_at_95"] <= 1.0


def _vectors(texts):
    out = np.zeros((len(texts), EMBEDDING_DIM), dtype=np.float32)
    for i, t in enumerate(texts):
        out[i, len(t) % EMBEDDING_DIM] = 1.0
    return out


def _damage_with(kind, path, texts):
    if kind == "bare array":
        with path.open("wb") as fh:
            np.save(fh, np.zeros(3))
    elif kind == "2-d keys":
        np.savez(path, embeddings=_vectors(texts), keys=np.zeros((len(texts), 2), "S16"))
    elif kind == "nan vectors":
        np.savez(path, embeddings=np.full((len(texts), EMBEDDING_DIM), np.nan, np.float32),
                 keys=embedding_cache._text_keys(texts))


@pytest.mark.parametrize("kind", ["bare array", "2-d keys", "nan vectors"])
@pytest.mark.parametrize("grown", [False, True])
def test_a_damaged_cache_file_is_recomputed(tmp_path, monkeypatch, kind, grown):
    """A cache file that is not what the cache writes is skipped and the texts embedded again:
    was a TypeError (bare array; 2-d keys on a grown list) or NaN vectors handed to training."""
    calls = []
    monkeypatch.setattr(embedding_cache, "embed_texts",
                        lambda texts, progress=None: calls.append(list(texts)) or _vectors(texts))
    monkeypatch.setattr(embedding_cache, "embedder_fingerprint", lambda: "f" * 12)
    texts = ["a", "bb"]
    embedding_cache.cached_embeddings(texts, cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.npz")
    _damage_with(kind, path, texts)
    want = [*texts, "ccc"] if grown else texts
    calls.clear()
    got = embedding_cache.cached_embeddings(want, cache_dir=tmp_path)
    np.testing.assert_array_equal(got, _vectors(want))
    assert calls == [want]
