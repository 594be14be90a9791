"""Each test gets its own semantic cache file (tests/conftest.py, ``_own_cache_dir``).

Before: HYBRIDLLM_CACHE_DIR was one folder for the whole session, so every test that built a
client without ``cache=False`` or a ``cache_path`` read and wrote one file: a test was served the
answer another test had cached (route "cache" instead of "edge"), and its result hung on the
(random) order. Each pair below is symmetric: whichever of the two runs second failed before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hybridllm import HybridLLM
from hybridllm._paths import cache_dir
from hybridllm.backends.fake import FakeBackend
from hybridllm.cache import SemanticCache, _candidates
from hybridllm.cache.semantic import DEFAULT_FILENAME

from .cache.fakes import FakeEmbedder

QUESTION = "What is the capital of France?"
KW = {"model": "m", "params_key": {}}


@pytest.mark.parametrize("turn", ["one", "two"])
def test_a_client_s_default_cache_holds_no_other_test_s_answer(turn: str, monkeypatch) -> None:
    monkeypatch.setattr(_candidates, "get_embedder", FakeEmbedder)  # not the ONNX embedder
    with HybridLLM(edge=FakeBackend(reply=lambda m: f"answer of test {turn}"),
                   cache_verifier="cosine") as llm:
        first = llm.chat(QUESTION)
        assert (first.route, first.text) == ("edge", f"answer of test {turn}")
        again = llm.chat(QUESTION)  # the cache is on, and in the default file
        assert (again.route, again.text) == ("cache", first.text)
    assert (cache_dir() / DEFAULT_FILENAME).is_file()


@pytest.mark.parametrize("turn", ["one", "two"])
def test_a_default_semantic_cache_starts_empty(turn: str) -> None:
    with SemanticCache(verifier=None, embedder=FakeEmbedder()) as cache:
        assert cache.path == cache_dir() / DEFAULT_FILENAME
        assert cache.stats()["entries"] == 0
        cache.put([{"role": "user", "content": f"question of test {turn}"}], "an answer", **KW)
        assert cache.stats()["entries"] == 1


def test_the_content_keyed_builds_stay_shared_with_the_session() -> None:
    """The engine's CPU kernels (and training embeddings) are built once a session, not per test."""
    for name in ("kernels", "train"):
        link = cache_dir() / name
        assert link.is_symlink() and link.resolve().is_dir()
        assert link.resolve().parent != cache_dir()


@pytest.fixture(scope="module")
def module_cache():
    """A client of a wider scope, set up before the per-test folder: it keeps the session's."""
    folder = Path(os.environ["HYBRIDLLM_CACHE_DIR"])
    with SemanticCache(verifier=None, embedder=FakeEmbedder()) as cache:
        yield folder, cache


@pytest.mark.parametrize("turn", ["one", "two"])
def test_a_module_scoped_cache_keeps_working_across_tests(module_cache, turn: str) -> None:
    folder, cache = module_cache
    assert cache.path == folder / DEFAULT_FILENAME and cache_dir() != folder
    cache.put([{"role": "user", "content": "shared question"}], "shared answer", **KW)
    hit = cache.get([{"role": "user", "content": "shared question"}], **KW)
    assert hit is not None and hit.text == "shared answer"


def test_a_test_s_own_cache_dir_wins(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    with SemanticCache(verifier=None, embedder=FakeEmbedder()) as cache:
        assert cache.path == tmp_path / DEFAULT_FILENAME
