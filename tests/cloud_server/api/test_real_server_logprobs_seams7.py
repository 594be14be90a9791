"""Token log-probabilities through the real server (SmolLM2, loopback) where they meet the rest:
multi-byte characters split over tokens (each entry's ``bytes`` are its token's own, so the
entries' bytes joined are the answer's UTF-8; the legacy shape names such a token by its bytes),
``stream_options.include_usage``, ``max_tokens``
reached, a prompt over the context length, and a stream the client hangs up on (the engine's pool
is free again)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .helpers import metric_value, served_smollm2, sse_payloads

pytestmark = pytest.mark.real

MODEL = "smollm2-135m-instruct"
# SmolLM2 copies these greedily: CJK characters and an emoji are 3 and 4 bytes, over several tokens
SPLIT = [{"role": "user", "content": "Write 'café naïve 日本語 😀' three times."}]


@pytest.fixture(scope="module")
def url(smollm2_path: Path) -> Iterator[str]:
    with served_smollm2(smollm2_path, MODEL, "--max-model-len", "256") as base:
        yield base


def _chat(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, **body}, timeout=120)


def _joined_bytes(content: list[dict]) -> bytes:
    return bytes(b for e in content for b in e["bytes"])


def test_entry_bytes_rebuild_characters_split_over_tokens(url: str) -> None:
    r = _chat(url, messages=SPLIT, logprobs=True, top_logprobs=2, temperature=0, max_tokens=24)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text, content = choice["message"]["content"], choice["logprobs"]["content"]
    assert "日本語" in text  # the case this test is about: tokens that are parts of characters
    assert any(e["token"] == "\ufffd" for e in content)
    assert _joined_bytes(content) == text.encode("utf-8")
    for e in content:  # an alternative's bytes are its own too: valid bytes, never U+FFFD's
        for t in e["top_logprobs"]:
            assert t["token"] != "\ufffd" or t["bytes"] != list("\ufffd".encode())

    # streamed: the chunks' entries carry the same bytes
    body = {"model": MODEL, "messages": SPLIT, "logprobs": True, "temperature": 0, "max_tokens": 24,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as s:
        events = [e for e in sse_payloads(s.iter_lines()) if e != "[DONE]"]
    choices = [c for ev in events for c in ev["choices"]]
    streamed = [e for c in choices if c.get("logprobs") for e in c["logprobs"]["content"]]
    streamed_text = "".join(c["delta"].get("content") or "" for c in choices)
    assert streamed_text == text
    assert _joined_bytes(streamed) == text.encode("utf-8")
    assert events[-1]["usage"]["completion_tokens"] == len(streamed) == 24  # usage chunk last


def _token_bytes(token: str) -> bytes:
    if token.startswith("bytes:"):  # a part-character token, named by its bytes (OpenAI's form)
        return bytes(int(h, 16) for h in token[len("bytes:"):].split("\\x")[1:])
    return token.encode("utf-8")


def _utf8_length(lead: int) -> int:
    """The bytes of the UTF-8 character that starts with ``lead`` (0 for a byte that starts none)."""
    return 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4 if 0xF0 <= lead < 0xF8 else 0


def test_legacy_completions_name_part_character_tokens_by_their_bytes(url: str) -> None:
    body = {"model": MODEL, "prompt": "Japanese: 日本語 日本語 日本語", "logprobs": 3, "max_tokens": 12,
            "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert any(t.startswith("bytes:") for t in lp["tokens"])  # the case this test is about
    joined, text = b"".join(_token_bytes(t) for t in lp["tokens"]), choice["text"].encode("utf-8")
    # the tokens hold the text's bytes; a character that max_tokens cut off at the end is left out
    # of the text (never a U+FFFD), its bytes only in the last tokens (which answers end on a cut
    # character depends on the CPU's kernels: on an AVX2-only one, "パッ" and then half of a third)
    assert joined.startswith(text), (joined, text)
    cut = joined[len(text):]
    assert not cut or (choice["finish_reason"] == "length" and len(cut) < _utf8_length(cut[0])), cut
    for tok, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        # the 3 most likely and the emitted one: part-character alternatives no longer share a key
        assert 3 <= len(top) <= 4 and top[tok] == value, top


def test_max_tokens_reached_and_a_too_long_prompt(url: str) -> None:
    r = _chat(url, messages=SPLIT, logprobs=True, temperature=0, max_tokens=3)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert len(body["choices"][0]["logprobs"]["content"]) == body["usage"]["completion_tokens"] == 3
    long = [{"role": "user", "content": "word " * 400}]
    r = _chat(url, messages=long, logprobs=True, top_logprobs=5, max_tokens=4)
    assert r.status_code == 400, r.text
    assert "context" in r.json()["error"]["message"].lower() or r.json()["error"]["param"] == "messages"


def test_a_stream_hung_up_on_frees_the_pool(url: str) -> None:
    body = {"model": MODEL, "messages": SPLIT, "logprobs": True, "top_logprobs": 20, "max_tokens": 200,
            "ignore_eos": True, "stream": True}
    for _ in range(3):
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as s:
            assert s.status_code == 200
            seen = 0
            for line in s.iter_lines():
                seen += line.startswith("data: ")
                if seen >= 3:
                    break
    names = ("hybridllm_num_requests_running", "hybridllm_num_requests_waiting",
             "hybridllm_kv_cache_blocks_free", "hybridllm_kv_cache_blocks_total")
    deadline = time.monotonic() + 20
    while True:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        v = {n: metric_value(text, n, model=MODEL) for n in names}
        idle = v[names[0]] == 0 and v[names[1]] == 0 and v[names[2]] == v[names[3]]
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert v[names[0]] == 0 and v[names[1]] == 0 and v[names[2]] == v[names[3]], v
    # and the server still answers with log-probabilities
    r = _chat(url, messages=SPLIT, logprobs=True, max_tokens=2)
    assert r.status_code == 200 and len(r.json()["choices"][0]["logprobs"]["content"]) == 2
