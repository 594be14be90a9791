"""The embedder as a cache user drives it: characters its tokenizer deletes without a trace, texts
from numpy, wrong types, a damaged tokenizer file, many threads at once. Fast: the real MiniLM
tokenizer, a stand-in graph."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridllm._exceptions import ModelError
from hybridllm.cache import SemanticCache
from hybridllm.cache import encoder as encoder_module
from hybridllm.cache.embedder import DIM, MAX_TOKENS, Embedder
from hybridllm.cache.encoder import OnnxEncoder
from hybridllm.cache.prepare import TOKENIZER_NAME


class _Graph:
    """Stands in for the ONNX session: a unit vector per row, a function of its token ids only."""

    def run(self, _names: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        out = np.zeros((len(ids), DIM), dtype=np.float32)
        for row, (r_ids, r_mask) in enumerate(zip(ids, mask, strict=True)):
            np.add.at(out[row], r_ids[r_mask == 1] % DIM, 1.0)
        return [out / np.linalg.norm(out, axis=1, keepdims=True)]


def _fake_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoder_module, "cpu_session", lambda _ort, _path, _threads: _Graph())


def _embedder(folder: Path) -> Embedder:
    model = Embedder.__new__(Embedder)
    OnnxEncoder.__init__(model, folder, quantized=True, num_threads=None, max_tokens=MAX_TOKENS)
    return model


@pytest.fixture
def embedder(minilm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Embedder:
    _fake_session(monkeypatch)
    return _embedder(minilm_dir)


KW = {"model": "m", "params_key": {"temperature": 0}}


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize(
    ("text", "other"),
    [
        ("What does \ue0a0 mean in my prompt?", "What does \ue0b0 mean in my prompt?"),  # icon font
        ("Is \uf8ff on the keyboard?", "Is \uf8fe on the keyboard?"),  # the Apple logo
        ("Was ist \U000f0001 hier?", "Was ist \U000f0002 hier?"),  # plane-15 private use
        ("Is this \ufffd edible?", "Is this edible?"),  # U+FFFD
    ],
)
def test_a_character_the_tokenizer_deletes_is_not_read_whole(
    embedder: Embedder, text: str, other: str
) -> None:
    """The BERT normalizer deletes private-use characters and U+FFFD without an [UNK]: the two
    questions were one input to the graph (cosine 1.0), the length check said both were read
    whole, and the cache served one's answer for the other. Now such a question is served on an
    exact repeat only, as one with an emoji."""
    assert embedder._tokenizer.encode(text).ids == embedder._tokenizer.encode(other).ids
    assert not embedder.fits(text)
    embedder.embed_one(text)  # answered from the run too
    assert not embedder.fits(text)
    assert embedder.fits("Wie spät ist es in Zürich?")  # plain non-ASCII text still fits


def test_the_cache_does_not_serve_a_private_use_question_for_another(
    embedder: Embedder, tmp_path: Path
) -> None:
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, min_similarity=0.5, embedder=embedder)
    cache.put(_user("What does \ue0a0 mean in my prompt?"), "branch symbol", **KW)
    assert cache.get(_user("What does \ue0b0 mean in my prompt?"), **KW) is None
    assert cache.get(_user("What does \ue0a0 mean in my prompt?"), **KW).text == "branch symbol"
    cache.close()


def test_a_half_emoji_is_not_read_whole(embedder: Embedder) -> None:
    """A lone surrogate (half an emoji from JSON) becomes U+FFFD, which the tokenizer deletes."""
    assert not embedder.fits("Is this \ud83c edible?")
    assert embedder.embed_one("Is this \ud83c edible?").shape == (DIM,)


def test_embed_takes_a_numpy_array_of_texts(embedder: Embedder) -> None:
    """``not texts`` on an array of two raised "The truth value of an array ... is ambiguous"."""
    texts = ["How do I learn Python?", "What is the capital of France?"]
    np.testing.assert_array_equal(embedder.embed(np.array(texts)), embedder.embed(texts))
    np.testing.assert_array_equal(embedder.embed(tuple(texts)), embedder.embed(texts))
    assert embedder.embed(np.array([], dtype=str)).shape == (0, DIM)


@pytest.mark.parametrize("bad", [None, 3, b"bytes", ("a", "b")])
def test_a_text_that_is_not_a_string_is_a_clear_type_error(embedder: Embedder, bad: Any) -> None:
    """A tuple was embedded as a text pair, in silence; None and bytes failed deep in the tokenizer
    ("'NoneType' object is not iterable")."""
    with pytest.raises(TypeError, match=r"embed_one\(\) must be a string"):
        embedder.embed_one(bad)
    with pytest.raises(TypeError, match=r"embed\(\) item 1 must be a string"):
        embedder.embed(["fine", bad])


def test_a_damaged_tokenizer_file_is_named(
    minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tokenizer's own error ("expected value at line 1 column 1") names no file."""
    _fake_session(monkeypatch)
    (tmp_path / TOKENIZER_NAME).write_text((minilm_dir / TOKENIZER_NAME).read_text()[:1000])
    with pytest.raises(ModelError) as err:
        _embedder(tmp_path)
    assert str(tmp_path / TOKENIZER_NAME) in str(err.value)
    assert "hybridllm models prepare minilm-l6-v2" in str(err.value)


def test_threads_give_the_one_thread_vectors_and_checks(embedder: Embedder) -> None:
    """Many threads embedding and checking at once (the length memo shared and evicted under
    them) give what one thread gives."""
    texts = [f"Frage Nummer {i}: wie spät ist es in Zürich? " * (1 + i % 3) for i in range(24)]
    texts += ["Is this 🍄 edible?", "What does \ue0a0 mean?", "文章 " * 200]
    want = [(embedder.embed_one(t), embedder.fits(t)) for t in texts]
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in np.random.default_rng(seed).permutation(len(texts)).tolist() * 3:
                vec, fits = embedder.embed_one(texts[i]), embedder.fits(texts[i])
                assert np.array_equal(vec, want[i][0]) and fits == want[i][1], texts[i]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    batched = embedder.embed(texts, workers=4)
    assert np.array_equal(batched, np.stack([v for v, _ in want]))
