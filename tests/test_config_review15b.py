"""Settings review 15b: a config file with a byte order mark loads, and a cache floor that could
never let an answer in is refused when the settings are loaded."""

from __future__ import annotations

import pytest

from hybridllm import ConfigError
from hybridllm._config import HybridLLMConfig, load_config


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch, tmp_path):
    import os

    for name in list(os.environ):
        if name.startswith("HYBRIDLLM_"):
            monkeypatch.delenv(name)
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    monkeypatch.setenv("HYBRIDLLM_CONFIG", str(empty))


def test_a_config_file_saved_with_a_byte_order_mark_loads(tmp_path):
    """Before: a config.toml saved by Windows Notepad (UTF-8 with a BOM) was refused as "not valid
    TOML: Invalid statement (at line 1, column 1)", a line that looks right."""
    path = tmp_path / "config.toml"
    path.write_bytes("\ufeff[hybridllm]\nmax_tokens = 7\nnamespace = \"caf\u00e9\"\n".encode())
    cfg = load_config(path)
    assert cfg.max_tokens == 7 and cfg.namespace == "caf\u00e9"


@pytest.mark.parametrize("raw", ["0.5", "1", "0.001"])
def test_a_positive_cache_floor_is_refused_from_the_environment(monkeypatch, raw):
    """Before: HYBRIDLLM_CACHE_MIN_LOGPROB=0.5 (a probability taken for a log-probability) loaded,
    and since a mean token log-probability is never above 0 the cache silently stored nothing."""
    monkeypatch.setenv("HYBRIDLLM_CACHE_MIN_LOGPROB", raw)
    with pytest.raises(ConfigError, match=r"HYBRIDLLM_CACHE_MIN_LOGPROB=.*cache_min_logprob must be "
                                          r"a finite number or None, and at most 0"):
        load_config()


def test_a_positive_cache_floor_is_refused_in_the_file_and_the_constructor(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("cache_min_logprob = 0.9\n")
    with pytest.raises(ConfigError, match=r"Config file .*cache_min_logprob must be"):
        load_config(path)
    with pytest.raises(ConfigError, match="cache_min_logprob"):
        HybridLLMConfig(cache_min_logprob=2.0)


@pytest.mark.parametrize("floor", [0.0, -0.825, -30.0, None])
def test_cache_floors_that_work_still_load(floor):
    assert HybridLLMConfig(cache_min_logprob=floor).cache_min_logprob == floor
