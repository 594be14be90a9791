"""Settings the client cannot run with fail when they are loaded, not at the first request."""

from __future__ import annotations

import pytest

from hybridllm import ConfigError
from hybridllm._config import HybridLLMConfig, load_config


@pytest.mark.parametrize("value", [0, -1.0, float("nan")])
def test_a_cache_ttl_that_is_not_positive_is_refused_at_load(value: float) -> None:
    with pytest.raises(ConfigError, match="cache_ttl_s must be positive or None"):
        load_config(cache_ttl_s=value)


def test_cache_ttl_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRIDLLM_CACHE_TTL_S", "0")
    with pytest.raises(ConfigError, match="cache_ttl_s"):
        load_config()
    monkeypatch.setenv("HYBRIDLLM_CACHE_TTL_S", "60")
    assert load_config().cache_ttl_s == 60.0
    assert HybridLLMConfig(cache_ttl_s=None).cache_ttl_s is None  # no expiry
