"""The penalties' defaults come from the settings, as every other sampling default does (review 31).

``presence_penalty`` / ``frequency_penalty`` were request options only: ``HYBRIDLLM_PRESENCE_PENALTY``
or a config file's ``frequency_penalty`` were refused as unknown settings (or, had the field been
added to the settings alone, silently unused by the client). Now they are settings, checked when
loaded by the request's rules, and a request's own value still wins.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm import ConfigError, HybridLLM

from .test_penalties_review31 import Recording


def test_the_settings_give_the_penalties_defaults_and_a_request_overrides_them(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("frequency_penalty = 0.5\n")
    monkeypatch.setenv("HYBRIDLLM_PRESENCE_PENALTY", "-1.5")
    edge = Recording()
    with HybridLLM(edge=edge, cache=False, config=config) as llm:
        llm.chat("hi")
        assert (edge.params[-1].presence_penalty, edge.params[-1].frequency_penalty) == (-1.5, 0.5)
        llm.chat("hi", frequency_penalty=0)
        assert edge.params[-1].frequency_penalty == 0.0


@pytest.mark.parametrize("value", ["3", "nan"])
def test_a_bad_default_fails_when_loaded_naming_it(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("HYBRIDLLM_FREQUENCY_PENALTY", value)
    with pytest.raises(ConfigError, match="frequency_penalty"):
        HybridLLM(edge=Recording(), cache=False)
