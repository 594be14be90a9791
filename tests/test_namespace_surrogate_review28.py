"""A namespace holding half an emoji (a lone UTF-16 surrogate; bytes that are not UTF-8 in the
environment arrive so) is refused where it is given, not on every cache lookup afterwards (the
cache refuses it, so each such request logged a failed lookup and never hit)."""

from __future__ import annotations

import pytest

from hybridllm import ConfigError, HybridLLM, InvalidRequestError
from hybridllm._config import load_config
from hybridllm.backends.fake import FakeBackend


def test_a_request_namespace_with_a_lone_surrogate_is_refused():
    llm = HybridLLM(edge=FakeBackend(reply=lambda _m: "fine"), cache=False)
    try:
        with pytest.raises(InvalidRequestError, match="surrogate"):
            llm.chat("hi", namespace="t\ud83d")
        assert llm.chat("hi", namespace="t\U0001f600").text == "fine"  # a whole emoji is text
    finally:
        llm.close()


def test_a_configured_namespace_with_a_lone_surrogate_is_refused(monkeypatch):
    monkeypatch.setenv("HYBRIDLLM_NAMESPACE", "t\udcff")  # what os.environ makes of byte 0xff
    with pytest.raises(ConfigError, match="surrogate"):
        load_config()
    with pytest.raises(ConfigError, match="surrogate"):
        HybridLLM(edge=FakeBackend(), cache=False, namespace="t\ud83d")
