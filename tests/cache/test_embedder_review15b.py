"""The embedder's length check and the verifier's surface features on text that is not ASCII
English: a long Korean question compared by its head only, two different Russian or Chinese
questions read as identical. Fast: the real MiniLM tokenizer, a stand-in graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridllm.cache import SemanticCache
from hybridllm.cache import encoder as encoder_module
from hybridllm.cache.embedder import DIM, MAX_TOKENS, Embedder
from hybridllm.cache.encoder import OnnxEncoder
from hybridllm.cache.features import HANDCRAFTED, handcrafted
from hybridllm.cache.verifier import HitVerifier


class _Graph:
    """Stands in for the ONNX session: a unit vector per row, a function of its token ids (as the
    real graph's: one input, one vector)."""

    def run(self, _names: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        out = np.zeros((len(ids), DIM), dtype=np.float32)
        for row, (r_ids, r_mask) in enumerate(zip(ids, mask, strict=True)):
            np.add.at(out[row], r_ids[r_mask == 1] % DIM, 1.0)
        return [out / np.linalg.norm(out, axis=1, keepdims=True)]


class _Counting:
    """The real tokenizer, counting what it is asked to encode."""

    def __init__(self, real: Any) -> None:
        self.real, self.inputs = real, []

    def encode_batch(self, inputs: list[Any], *args: Any, **kwargs: Any) -> Any:
        self.inputs.extend(inputs)
        return self.real.encode_batch(inputs, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.fixture
def embedder(minilm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Embedder:
    monkeypatch.setattr(encoder_module, "cpu_session", lambda _ort, _path, _threads: _Graph())
    model = Embedder.__new__(Embedder)
    OnnxEncoder.__init__(model, minilm_dir, quantized=True, num_threads=None, max_tokens=MAX_TOKENS)
    model._tokenizer = _Counting(model._tokenizer)
    return model


KW = {"model": "m", "params_key": {"temperature": 0}}


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_a_character_the_embedder_cannot_read_is_served_on_an_exact_repeat_only(
    embedder: Embedder, tmp_path: Path
) -> None:
    """Both emoji are one [UNK] to MiniLM: the two questions were one input, cosine 1.0, and the
    mushroom's answer was served for the herb. Such a question is matched exactly only (as one
    longer than the embedder reads); plain questions still hit."""
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, min_similarity=0.5, embedder=embedder)
    cache.put(_user("Is this 🍄 edible?"), "mushroom answer", **KW)
    cache.put(_user("How do I learn Python?"), "python answer", **KW)
    mushroom, herb = embedder.embed_one("Is this 🍄 edible?"), embedder.embed_one("Is this 🌿 edible?")
    assert np.isclose(mushroom @ herb, 1.0)  # one input to the graph
    assert cache.get(_user("Is this 🌿 edible?"), **KW) is None
    assert cache.get(_user("is this 🍄 edible"), **KW).text == "mushroom answer"  # an exact repeat
    assert cache.get(_user("How do I learn Python ?"), **KW).text == "python answer"
    # the query's check is answered from its embedding run: not tokenized a second time
    asked = "Is this 🌱 edible?"
    vec = cache.embed_query(_user(asked))
    embedder._tokenizer.inputs.clear()
    assert cache.get(_user(asked), embedding=vec, exact_checked=True, **KW) is None
    assert asked not in embedder._tokenizer.inputs
    cache.close()


def test_a_short_korean_question_past_the_window_does_not_fit(embedder: Embedder) -> None:
    """126 Hangul syllables and spaces: each syllable is three word pieces (its jamo), so the text
    fills more than 256 tokens and its tail is never read. It was taken to fit unread (under
    (256 - 2) / 2 characters), and the cache compared such a question by its head only."""
    text = "문장입니다 " * 21  # 126 characters
    assert embedder._tokenizer.encode(text).overflowing  # the tokenizer cuts it
    assert not embedder.fits(text)
    assert not embedder.fits("짧은 질문", text)


@pytest.mark.parametrize("chars", ["문장입니다 ", "a", "İ", "ᄒ", "\U0001d1be", "café, "])
def test_whatever_counts_as_short_fits(embedder: Embedder, chars: str) -> None:
    """The length under which a text is not tokenized holds for the characters that tokenize
    longest (a Hangul syllable or a musical symbol: three pieces) and for plain ones."""
    text = (chars * embedder.max_tokens)[: embedder._always_fits]
    encoding = embedder._tokenizer.encode(text)
    assert not encoding.overflowing
    unk = embedder._tokenizer.token_to_id("[UNK]")
    assert embedder.fits(text) == (unk not in encoding.ids)  # the musical symbol is an [UNK]


@pytest.mark.parametrize(
    ("query", "cached"),
    [
        ("Какая столица Франции?", "Какая столица Германии?"),  # which capital: France / Germany
        ("法国的首都是哪里？", "德国的首都是哪里？"),
        ("Ποια είναι η πρωτεύουσα της Γαλλίας;", "Ποια είναι η πρωτεύουσα της Ιταλίας;"),
    ],
)
def test_different_questions_in_other_scripts_differ(query: str, cached: str) -> None:
    """With ASCII-only words both texts had none: every overlap read 1.0 and ``exact_match`` 1.0,
    and the shipped feature verifier served the other question's answer (0.98 at cosine 0.95)."""
    feats = dict(zip(HANDCRAFTED, handcrafted(query, cached, 0.95), strict=True))
    assert feats["exact_match"] == 0.0
    assert feats["word_jaccard"] < 1.0
    assert feats["char_trigram_jaccard"] < 1.0
    verifier = HitVerifier.load()
    q_vec, c_vec = _pair(0.95)
    prob = verifier.predict([query], [cached], q_vec, c_vec)
    assert not verifier.accept(prob, np.array([0.95]))[0], prob


def test_ascii_text_splits_as_before() -> None:
    """The verifier was trained on English text: its words are the ones it was trained with."""
    from hybridllm.cache.features import _WORD

    text = "don't stop: it's 3'x, foo_bar 4.5 qmct'k6 rock'n'roll"
    assert _WORD.findall(text) == ["don't", "stop", "it's", "3'x", "foo", "bar", "4", "5", "qmct'k", "6",
                                   "rock'n", "roll"]
    assert _WORD.findall("café l'été") == ["café", "l'été"]


def _pair(cosine: float) -> tuple[np.ndarray, np.ndarray]:
    """Two fixed ``[1, DIM]`` unit vectors at ``cosine``."""
    a = np.zeros(DIM)
    a[0] = 1.0
    b = np.zeros(DIM)
    b[0], b[1] = cosine, np.sqrt(1.0 - cosine**2)
    return a[None].astype(np.float32), b[None].astype(np.float32)
