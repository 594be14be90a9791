"""Settings that could not work fail when they are loaded, naming their source; no key of a
config file is silently ignored."""

from __future__ import annotations

import pytest

from hybridllm import ConfigError
from hybridllm._config import load_config


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch, tmp_path):
    import os

    for name in list(os.environ):
        if name.startswith("HYBRIDLLM_"):
            monkeypatch.delenv(name)
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    monkeypatch.setenv("HYBRIDLLM_CONFIG", str(empty))


@pytest.mark.parametrize("content, outside", [
    ("max_tokens = 5\n[hybridllm]\ntemperature = 0.1\n", "max_tokens"),  # above the header
    ("[hybridllm]\ntemperature = 0.1\n[hybridlm]\nmax_tokens = 3\n", "hybridlm"),  # a typo'd table
])
def test_keys_outside_the_hybridllm_table_are_refused(tmp_path, content, outside):
    """Before: with a [hybridllm] table every other key of the file was dropped without a word
    (max_tokens stayed 256)."""
    path = tmp_path / "config.toml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=rf"{path}.*\['{outside}'\] outside \[hybridllm\]"):
        load_config(path)


def test_settings_at_the_top_level_or_under_the_table_still_load(tmp_path):
    top, table = tmp_path / "top.toml", tmp_path / "table.toml"
    top.write_text("max_tokens = 5\n")
    table.write_text("[hybridllm]\nmax_tokens = 6\n")
    assert load_config(top).max_tokens == 5 and load_config(table).max_tokens == 6


@pytest.mark.parametrize("name, raw, problem", [
    # 0 s to connect failed every cloud call at once: the device silently answered everything
    ("cloud_connect_timeout_s", "0", "cloud_connect_timeout_s must be a positive number"),
    ("cloud_connect_timeout_s", "nan", "cloud_connect_timeout_s must be a positive number"),
    ("cloud_read_timeout_s", "-1", "cloud_read_timeout_s must be a positive number"),
    ("cloud_read_timeout_s", "inf", "cloud_read_timeout_s must be a positive number"),
    ("cloud_breaker_threshold", "0", "cloud_breaker_threshold must be at least 1"),
    ("cloud_breaker_cooldown_s", "nan", "cloud_breaker_cooldown_s must be a number >= 0"),
    ("cloud_breaker_cooldown_s", "-5", "cloud_breaker_cooldown_s must be a number >= 0"),
    ("cloud_max_retries", "-1", "cloud_max_retries must be >= 0"),
    # nan compared false with every answer's log-probability: every unsure answer was cached
    ("cache_min_logprob", "nan", "cache_min_logprob must be a finite number or None"),
    ("cloud_joules_per_token", "inf", "cloud_joules_per_token must be finite"),
])
def test_cloud_and_cache_numbers_that_cannot_work_are_refused(monkeypatch, name, raw, problem):
    """Before: each of these loaded (`hybridllm config show` printed it) and misbehaved later."""
    monkeypatch.setenv(f"HYBRIDLLM_{name.upper()}", raw)
    with pytest.raises(ConfigError, match=rf"HYBRIDLLM_{name.upper()}='{raw}': {problem}"):
        load_config()


def test_a_bad_number_in_the_file_names_the_file(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("cloud_breaker_threshold = 0\n")
    with pytest.raises(ConfigError, match=rf"Config file {path}: cloud_breaker_threshold"):
        load_config(path)


@pytest.mark.parametrize("name, raw, value", [
    ("cloud_breaker_cooldown_s", "0", 0.0),  # probe again at once: allowed
    ("cache_min_logprob", "none", None),  # store every answer: allowed
    ("cloud_max_retries", "0", 0),
])
def test_edge_values_that_work_still_load(monkeypatch, name, raw, value):
    monkeypatch.setenv(f"HYBRIDLLM_{name.upper()}", raw)
    assert getattr(load_config(), name) == value
