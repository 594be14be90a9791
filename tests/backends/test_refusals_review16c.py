"""Refusal memory (``backends/refusals.py``): which endpoints count as this machine, and a damaged
file that is ignored, never a traceback."""

from __future__ import annotations

import pytest

from hybridllm.backends.refusals import RefusalMemory, is_hosted


@pytest.mark.parametrize("url", [
    "https://0.0.0.0:8443/v1",  # a client that connects to 0.0.0.0 or :: reaches this machine
    "https://[::]:8443/v1",
    "https://localhost.:8443/v1",  # the same name, rooted
    "https://dev.localhost./v1",
    "https://[::ffff:127.0.0.1]/v1",  # 127.0.0.1 written as IPv6
])
def test_this_machine_under_other_spellings_is_not_hosted(url):
    assert is_hosted(url) is False


@pytest.mark.parametrize("url", [
    "https://api.openai.com./v1", "https://10.0.0.5/v1", "https://[::ffff:8.8.8.8]/v1",
])
def test_other_machines_stay_hosted(url):
    assert is_hosted(url) is True


def test_a_file_nested_past_the_stack_is_ignored_and_replaced(tmp_path):
    path = tmp_path / "refused.json"
    path.write_text("[" * 200_000, encoding="utf-8")  # json.loads raised RecursionError
    memory = RefusalMemory(path, clock=lambda: 1000.0)
    assert memory.recall("https://api.example.com/v1", "m") is None
    memory.remember("https://api.example.com/v1", "m", frozenset({"top_k"}))
    assert memory.recall("https://api.example.com/v1", "m") == (frozenset({"top_k"}), 1000.0)
