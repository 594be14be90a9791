"""`hybridllm serve` and a request that leaves out max_tokens (review 28): it gets the proxy's
`max_tokens` setting (256 by default), not the rest of the context as vLLM and llama.cpp's server
give. Kept (the library's default), but the README's serve section now says so and how to change
it; these tests hold the code to what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

MSGS = [{"role": "user", "content": "hi"}]
README = Path(__file__).resolve().parents[1] / "README.md"


def limits_sent(bodies: list[dict], **settings) -> list[int]:
    """The max_tokens the device model was given for each request body."""
    edge = FakeBackend(reply=lambda m: "one two three")
    seen: list[int] = []
    original = edge.stream

    def spy(messages, params):
        seen.append(params.max_tokens)
        return original(messages, params)

    edge.stream = spy  # type: ignore[method-assign]
    llm = HybridLLM(edge=edge, cache=False, **settings)
    with TestClient(create_app(llm)) as http:
        for body in bodies:
            r = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS, **body})
            assert r.status_code == 200, r.text
    llm.close()
    return seen


def test_an_omitted_or_null_max_tokens_is_the_setting(monkeypatch):
    monkeypatch.delenv("HYBRIDLLM_MAX_TOKENS", raising=False)
    bodies = [{}, {"max_tokens": None}, {"max_tokens": 5}, {"max_completion_tokens": 7}]
    assert limits_sent(bodies) == [256, 256, 5, 7]
    monkeypatch.setenv("HYBRIDLLM_MAX_TOKENS", "2048")  # what the README tells an operator to set
    assert limits_sent(bodies[:2]) == [2048, 2048]


def test_the_readme_serve_section_says_what_an_omitted_max_tokens_means():
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### `hybridllm serve`"):]
    section = section[:section.index("\n## ")]
    said = re.search(r"leaves out `max_tokens`.*?\*\*256 tokens\*\*.*?"
                     r"HYBRIDLLM_MAX_TOKENS=\d+ hybridllm serve.*?`max_tokens = \d+` in\s+config\.toml",
                     section, re.DOTALL)
    assert said, "the serve section must say what an omitted max_tokens is and how to change it"
