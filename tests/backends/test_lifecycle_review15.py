"""Device and circuit settings that silently did the wrong thing (review 15)."""

from __future__ import annotations

import math

import pytest

from hybridllm import ConfigError, ModelNotFoundError
from hybridllm.backends.circuit import CircuitBreaker
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.llama_cpp import LlamaCppBackend


@pytest.mark.parametrize("fmt", ["chatml", "llama-2", "Template", ""])
def test_an_unknown_chat_format_is_refused_before_the_model_loads(tmp_path, fmt):
    # llama-cpp-python's own names became the plain completion transcript, silently
    with pytest.raises(ConfigError, match="chat_format must be"):
        LlamaCppBackend(tmp_path / "absent.gguf", chat_format=fmt)


@pytest.mark.parametrize("fmt", [None, "template", "completion"])
def test_the_known_chat_formats_still_pass_the_check(tmp_path, fmt):
    with pytest.raises(ModelNotFoundError):  # past the settings, the file is looked for
        LlamaCppBackend(tmp_path / "absent.gguf", chat_format=fmt)


@pytest.mark.parametrize("kwargs", [
    {"cooldown_s": math.nan}, {"cooldown_s": math.inf}, {"cooldown_s": -1.0},
    {"max_cooldown_s": math.nan}, {"max_cooldown_s": math.inf}, {"cooldown_s": "10"},
    {"threshold": 0}, {"threshold": -2}, {"threshold": 2.5}, {"threshold": True},
])
def test_settings_that_keep_a_circuit_open_for_good_are_refused(kwargs):
    with pytest.raises(ConfigError, match="breaker_"):
        CircuitBreaker(**kwargs)


def test_a_cloud_backend_built_directly_refuses_a_nan_cooldown():
    # the config checks its own numbers; a CloudBackend made by hand reached the breaker unchecked:
    # after one outage the circuit never went half-open again (NaN compares false)
    with pytest.raises(ConfigError, match="breaker_cooldown_s"):
        CloudBackend(base_url="http://127.0.0.1:9", breaker_cooldown_s=math.nan)


def test_valid_breaker_settings_still_work():
    now = [0.0]
    b = CircuitBreaker(threshold=1, cooldown_s=0, max_cooldown_s=0, clock=lambda: now[0])
    b.record_failure()
    assert b.allow()  # a zero cooldown probes at once
    assert CircuitBreaker(cooldown_s=2, max_cooldown_s=1).max_cooldown_s == 2
