"""`hybridllm cache stats | clear | eval`: the file they act on, what they report, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridllm import cli
from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {}}


def _ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _fill(path: Path) -> None:
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    cache.put(_ask("alpha question"), "a", namespace="alice", **KW)
    cache.put(_ask("beta question"), "b", namespace="bob", **KW)
    assert cache.get(_ask("alpha question"), namespace="alice", **KW) is not None
    assert cache.get(_ask("never asked"), namespace="alice", **KW) is None
    cache.close()


def _stats(capsys: pytest.CaptureFixture[str], *flags: str) -> dict:
    assert cli.main(["cache", "stats", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_stats_and_clear_act_on_the_configured_cache_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: without --path they opened the default file in the user cache dir (creating it),
    whatever cache_path the client was configured with, and reported SemanticCache's defaults
    for max_entries and ttl instead of the configured ones."""
    mine = tmp_path / "mine.sqlite3"
    _fill(mine)
    config = tmp_path / "config.toml"
    config.write_text(f'cache_path = "{mine}"\ncache_max_entries = 7\ncache_ttl_s = 3600\n')
    monkeypatch.setenv("HYBRIDLLM_CONFIG", str(config))
    stats = _stats(capsys)
    assert stats["path"] == str(mine) and stats["entries"] == 2
    assert stats["max_entries"] == 7 and stats["ttl_s"] == 3600
    assert cli.main(["cache", "clear", "--namespace", "alice"]) == 0
    assert "removed 1 entry from namespace 'alice'" in capsys.readouterr().out
    assert _stats(capsys)["namespaces"] == {"bob": 1}
    monkeypatch.setenv("HYBRIDLLM_CACHE_PATH", str(tmp_path / "other.sqlite3"))  # env over file
    assert _stats(capsys)["path"] == str(tmp_path / "other.sqlite3")


def test_stats_report_the_file_s_lookups_and_the_configured_verifier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: hits and misses were those of the command's own (fresh) object, always 0, and the
    verifier was always "cosine" with no threshold: the command opened the cache without one."""
    from hybridllm.cache.verifier import HitVerifier

    path = tmp_path / "c.sqlite3"
    _fill(path)
    monkeypatch.setenv("HYBRIDLLM_CACHE_VERIFIER", "features")
    stats = _stats(capsys, "--path", str(path))
    assert (stats["total_hits"], stats["total_misses"], stats["total_hit_rate"]) == (1, 1, 0.5)
    assert stats["verifier"] == "features" and stats["threshold"] == HitVerifier.load().threshold
    assert cli.main(["cache", "stats", "--path", str(path)]) == 0
    text = capsys.readouterr().out
    assert "1 hits, 1 misses" in text and "features, threshold" in text and "alice" in text


def test_stats_and_clear_without_a_cache_yet_create_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path / "cache"))
    assert _stats(capsys)["entries"] == 0
    assert cli.main(["cache", "clear"]) == 0
    assert "nothing to clear" in capsys.readouterr().out
    assert not (tmp_path / "cache").exists()


def test_clear_refuses_an_empty_namespace_and_names_the_real_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: --namespace "" deleted nothing and said "removed 0 entries from all namespaces"."""
    path = tmp_path / "c.sqlite3"
    _fill(path)
    assert cli.main(["cache", "clear", "--path", str(path), "--namespace", ""]) == 1
    assert "must not be empty" in capsys.readouterr().err
    assert cli.main(["cache", "clear", "--path", str(path), "--namespace", "alcie"]) == 0
    assert "no namespace 'alcie' (it has: 'alice', 'bob')" in capsys.readouterr().out
    assert cli.main(["cache", "clear", "--path", str(path)]) == 0
    assert "removed 2 entries from all namespaces" in capsys.readouterr().out


def test_stats_and_clear_read_a_cache_of_another_dimension(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a cache written with a 768-dim embedder could be neither inspected nor cleared."""

    class Wide(FakeEmbedder):
        dim = 768

    path = tmp_path / "wide.sqlite3"
    wide = SemanticCache(path, verifier=None, embedder=Wide())
    wide.put(_ask("a question"), "an answer", **KW)
    wide.close()
    assert _stats(capsys, "--path", str(path))["entries"] == 1
    assert cli.main(["cache", "clear", "--path", str(path)]) == 0
    assert "removed 1 entry" in capsys.readouterr().out
    assert _stats(capsys, "--path", str(path))["entries"] == 0


@pytest.mark.parametrize("limit", ["0", "-3", "many"])
def test_eval_refuses_a_limit_below_one(limit: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: --limit 0 or -3 evaluated one pair."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["cache", "eval", "--pairs", "pairs.jsonl", "--limit", limit])
    assert exit_.value.code == 2 and "--limit" in capsys.readouterr().err


def test_a_cache_path_under_home_means_the_same_file_to_the_client_and_the_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: SemanticCache took "~/c.sqlite3" literally (a folder named "~" in the working
    directory)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HYBRIDLLM_CACHE_PATH", "~/c.sqlite3")
    SemanticCache("~/c.sqlite3", verifier=None, embedder=FakeEmbedder()).close()
    assert (tmp_path / "c.sqlite3").is_file() and not (tmp_path / "~").exists()
    assert _stats(capsys)["path"] == str(tmp_path / "c.sqlite3")
    monkeypatch.setenv("HYBRIDLLM_CACHE_VERIFIER", str(tmp_path / "missing.npz"))
    stats = _stats(capsys)  # a verifier that cannot be read is reported, stats still work
    assert "unreadable" in stats["verifier"] and stats["threshold"] is None
