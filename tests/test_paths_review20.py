"""The SDK's folders (hybridllm._paths): a relative HYBRIDLLM_HOME, HYBRIDLLM_CACHE_DIR,
HYBRIDLLM_EMBEDDINGS_DIR or cache_path names the folder it named when first read, even after an
os.chdir; ``~`` is expanded and ``$VAR`` naming a set variable refused; a blank value is unset; a
file in a folder's place is refused naming the variable."""

from __future__ import annotations

import argparse
import os
import pickle
from pathlib import Path

import pytest

from hybridllm import _paths
from hybridllm._exceptions import ConfigError
from hybridllm._paths import cache_dir, data_dir


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    # each test resolves its relative values afresh (the names below are used by no other test)
    monkeypatch.setattr(_paths, "_RESOLVED", {}, raising=False)
    for name in ("HYBRIDLLM_HOME", "HYBRIDLLM_CACHE_DIR", "HYBRIDLLM_EMBEDDINGS_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.delenv("HYBRIDLLM_CACHE_PATH", raising=False)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")


def test_a_relative_home_is_the_same_folder_after_a_chdir(monkeypatch, tmp_path):
    monkeypatch.setenv("HYBRIDLLM_HOME", "models-r20")
    monkeypatch.delenv("HYBRIDLLM_CACHE_DIR")
    first = data_dir()
    assert first == tmp_path / "a" / "models-r20"
    os.chdir(tmp_path / "b")  # the app moves to its own folder after the first client
    assert data_dir() == first and cache_dir() == first / "cache"


def test_a_relative_cache_dir_is_the_same_folder_after_a_chdir(monkeypatch, tmp_path):
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", "cache-r20")
    assert cache_dir() == tmp_path / "a" / "cache-r20"
    os.chdir(tmp_path / "b")
    assert cache_dir() == tmp_path / "a" / "cache-r20"


def test_a_relative_embeddings_dir_is_absolute_and_kept(monkeypatch, tmp_path):
    from hybridllm.router.embedding_cache import feature_cache_dir

    monkeypatch.setenv("HYBRIDLLM_EMBEDDINGS_DIR", "emb-r20")
    assert feature_cache_dir() == tmp_path / "a" / "emb-r20"
    os.chdir(tmp_path / "b")
    assert feature_cache_dir() == tmp_path / "a" / "emb-r20"


def test_a_relative_cache_path_names_one_file_across_a_chdir(tmp_path):
    from hybridllm.cache import SemanticCache

    from .cache.fakes import FakeEmbedder

    first = SemanticCache("c-r20.sqlite3", verifier=None, embedder=FakeEmbedder())
    try:
        os.chdir(tmp_path / "b")
        assert first.path == tmp_path / "a" / "c-r20.sqlite3"
        assert first.stats()["path"] == str(tmp_path / "a" / "c-r20.sqlite3")
        second = SemanticCache("c-r20.sqlite3", verifier=None, embedder=FakeEmbedder())
        second.close()
        assert second.path == first.path and not (tmp_path / "b" / "c-r20.sqlite3").exists()
    finally:
        first.close()


def test_the_cache_cli_reads_cache_path_as_the_client_does(monkeypatch, tmp_path):
    from hybridllm.cache._cli import _settings
    from hybridllm.cache.semantic import DEFAULT_FILENAME

    monkeypatch.setenv("HYBRIDLLM_CACHE_PATH", "   ")  # blank: the default file, not one named "   "
    assert _settings(argparse.Namespace(path=None))[0] == cache_dir() / DEFAULT_FILENAME
    monkeypatch.setenv("HYBRIDLLM_CACHE_PATH", "c.sqlite3")
    assert _settings(argparse.Namespace(path=None))[0] == tmp_path / "a" / "c.sqlite3"


@pytest.mark.parametrize("name", ["HYBRIDLLM_HOME", "HYBRIDLLM_CACHE_DIR", "HYBRIDLLM_EMBEDDINGS_DIR"])
def test_a_set_variable_in_the_value_is_refused_not_made_a_folder(monkeypatch, tmp_path, name):
    from hybridllm.router.embedding_cache import feature_cache_dir

    read = {"HYBRIDLLM_HOME": data_dir, "HYBRIDLLM_CACHE_DIR": cache_dir,
            "HYBRIDLLM_EMBEDDINGS_DIR": feature_cache_dir}[name]
    monkeypatch.setenv("R20_BASE", str(tmp_path / "base"))
    for value in ("$R20_BASE/hl", "${R20_BASE}/hl"):
        monkeypatch.setenv(name, value)
        with pytest.raises(ConfigError) as info:
            read()
        msg = str(info.value)
        assert name in msg and "$R20_BASE" in msg and str(tmp_path / "base" / "hl") in msg, msg
    assert not any(p.name.startswith("$") for p in (tmp_path / "a").iterdir())


def test_an_unset_variable_and_a_lone_dollar_stay_literal(monkeypatch, tmp_path):
    monkeypatch.delenv("R20_NOT_SET", raising=False)
    monkeypatch.setenv("HYBRIDLLM_HOME", "$R20_NOT_SET/m")
    assert data_dir() == tmp_path / "a" / "$R20_NOT_SET" / "m"
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "costs$"))
    assert data_dir() == tmp_path / "costs$"


def test_the_home_folder_is_expanded_in_each_variable(monkeypatch):
    from hybridllm.router.embedding_cache import feature_cache_dir

    monkeypatch.setenv("HYBRIDLLM_HOME", "~/hl-r20")
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", "~/c-r20")
    monkeypatch.setenv("HYBRIDLLM_EMBEDDINGS_DIR", "~/e-r20")
    assert data_dir() == Path.home() / "hl-r20"
    assert cache_dir() == Path.home() / "c-r20"
    assert feature_cache_dir() == Path.home() / "e-r20"


def test_a_blank_value_is_unset_and_spaces_around_one_are_dropped(monkeypatch, tmp_path):
    import platformdirs

    monkeypatch.setenv("HYBRIDLLM_HOME", "  ")
    assert data_dir() == Path(platformdirs.user_data_dir("hybridllm", appauthor=False))
    monkeypatch.setenv("HYBRIDLLM_HOME", f"{tmp_path / 'models'} ")  # a .env line's trailing space
    assert data_dir() == tmp_path / "models"


def test_a_file_in_the_folders_place_is_refused_naming_the_variable(monkeypatch, tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "notes.txt"))
    monkeypatch.delenv("HYBRIDLLM_CACHE_DIR")
    for read in (data_dir, cache_dir):
        with pytest.raises(ConfigError, match="HYBRIDLLM_HOME=.*is a file, not a folder") as info:
            read()
        # an OSError too: the cloud engine's weight cache goes without its folder on an OSError
        assert isinstance(info.value, OSError)
        again = pickle.loads(pickle.dumps(info.value))
        assert type(again) is type(info.value) and str(again) == str(info.value)


def test_the_cli_says_which_variable_on_one_line(monkeypatch, capsys):
    from hybridllm.cli import main

    monkeypatch.setenv("R20_BASE", "/srv")
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", "$R20_BASE/cache")
    assert main(["cache", "stats"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: HYBRIDLLM_CACHE_DIR='$R20_BASE/cache' holds $R20_BASE"), err
    assert "'/srv/cache'" in err and len(err.splitlines()) == 1
