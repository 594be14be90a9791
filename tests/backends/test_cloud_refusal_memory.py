"""What a hosted cloud refused is remembered across processes (``backends/refusals.py``): the next
process's first request goes without those fields instead of paying a refused round trip for each
again. Over real HTTP against the peer of ``test_cloud_hosted`` (an OpenAI-like API that refuses
``top_k``), and in a second Python process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer

import pytest

from hybridllm import GenerationParams
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.refusals import FILE_NAME, TTL_S, RefusalMemory, is_hosted
from tests.backends.test_cloud_hosted import _Handler

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture
def peer():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.hits = []  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _answer(cloud: CloudBackend) -> str:
    return "".join(d.text for d in cloud.stream(MSGS, GenerationParams(max_tokens=8)))


def test_a_second_process_sends_its_first_request_without_what_the_first_learned(peer, tmp_path, monkeypatch,
                                                                                caplog):
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path))
    url = f"http://127.0.0.1:{peer.server_address[1]}/openai"
    first = CloudBackend(base_url=url, model="gpt-x", max_retries=0, remember_refusals=True)
    assert _answer(first) == "fine"
    assert [("top_k" in body) for _, body in peer.hits] == [True, False]  # learned by one refusal
    kept = json.loads((tmp_path / FILE_NAME).read_text())["entries"]
    assert [entry["fields"] for entry in kept.values()] == [["top_k"]]

    # another process: its first request already goes without top_k, and it says why
    peer.hits.clear()
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.WARNING, stream=sys.stderr)\n"
        "from hybridllm import GenerationParams\n"
        "from hybridllm.backends.cloud import CloudBackend\n"
        f"c = CloudBackend(base_url={url!r}, model='gpt-x', max_retries=0, remember_refusals=True)\n"
        "print(''.join(d.text for d in c.stream([{'role': 'user', 'content': 'hi'}], "
        "GenerationParams(max_tokens=8))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HYBRIDLLM_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "fine"
    assert [("top_k" in body) for _, body in peer.hits] == [False], peer.hits
    assert "refused top_k when asked" in out.stderr and FILE_NAME in out.stderr, out.stderr

    # another model of the same endpoint learns for itself
    peer.hits.clear()
    other = CloudBackend(base_url=url, model="gpt-y", max_retries=0, remember_refusals=True)
    assert _answer(other) == "fine"
    assert [("top_k" in body) for _, body in peer.hits] == [True, False]


def test_a_local_plain_http_endpoint_is_not_remembered_by_default(peer, tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path))
    url = f"http://127.0.0.1:{peer.server_address[1]}/openai"
    assert _answer(CloudBackend(base_url=url, model="gpt-x", max_retries=0)) == "fine"
    assert not (tmp_path / FILE_NAME).exists()
    peer.hits.clear()
    assert _answer(CloudBackend(base_url=url, model="gpt-x", max_retries=0)) == "fine"
    assert [("top_k" in body) for _, body in peer.hits] == [True, False]  # learned anew


@pytest.mark.parametrize(("url", "hosted"), [
    ("https://api.openai.com/v1", True), ("https://10.0.0.7:8443/v1", True),
    ("http://api.example.com/v1", False), ("https://localhost:8000/v1", False),
    ("https://127.0.0.1/v1", False), ("https://[::1]:8443/v1", False), ("https://dev.localhost/v1", False),
])
def test_only_https_endpoints_off_this_machine_count_as_hosted(url, hosted):
    assert is_hosted(url) is hosted


def test_what_was_refused_is_asked_again_after_its_time(tmp_path):
    now = [1_000_000.0]
    memory = RefusalMemory(tmp_path / FILE_NAME, clock=lambda: now[0])
    memory.remember("https://h/v1", "m", frozenset({"top_k", "stop"}))
    now[0] += TTL_S - 1
    assert memory.recall("https://h/v1", "m") == (frozenset({"top_k", "stop"}), 1_000_000.0)
    assert memory.recall("https://h/v1", "other") is None
    now[0] += 1
    assert memory.recall("https://h/v1", "m") is None
    memory.remember("https://g/v1", "m", frozenset({"min_p"}))  # the stale entry is dropped on write
    assert list(json.loads((tmp_path / FILE_NAME).read_text())["entries"]) == ["https://g/v1 m"]


def test_a_corrupt_or_unwritable_file_is_ignored(tmp_path, caplog):
    path = tmp_path / FILE_NAME
    path.write_text("{not json")
    memory = RefusalMemory(path)
    assert memory.recall("https://h/v1", "m") is None
    memory.remember("https://h/v1", "m", frozenset({"top_k"}))  # replaced by a good one
    assert RefusalMemory(path).recall("https://h/v1", "m")[0] == frozenset({"top_k"})
    blocked = RefusalMemory(path / "under-a-file" / FILE_NAME)  # its folder cannot be made
    with caplog.at_level(logging.DEBUG, logger="hybridllm.cloud"):
        blocked.remember("https://h/v1", "m", frozenset({"top_k"}))  # no error: nothing is kept
    assert blocked.recall("https://h/v1", "m") is None


def test_a_recalled_refusal_is_warned_of_once_per_process(peer, tmp_path, monkeypatch, caplog):
    """Each HybridLLM (each CloudBackend) of one process recalls the file; the warning that says
    what it leaves out was given again for each of them."""
    from hybridllm.backends import cloud_request

    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cloud_request, "_RECALLS_SAID", set())  # as in a new process
    url = f"http://127.0.0.1:{peer.server_address[1]}/openai"
    assert _answer(CloudBackend(base_url=url, model="gpt-x", max_retries=0, remember_refusals=True)) == "fine"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hybridllm"):
        for _ in range(3):
            assert _answer(CloudBackend(base_url=url, model="gpt-x", max_retries=0,
                                        remember_refusals=True)) == "fine"
    recalled = [r for r in caplog.records if "when asked" in r.getMessage()]
    assert len(recalled) == 1, [r.getMessage() for r in caplog.records]
    assert [("top_k" in body) for _, body in peer.hits[-3:]] == [False, False, False]  # still left out
