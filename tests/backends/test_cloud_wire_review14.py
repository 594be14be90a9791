"""The cloud client against servers that keep a stream alive without answering (SSE keepalive
comments) and against token counts of the wrong shape. The keepalive cases run on a raw socket, so
httpx's own read timeout is in play (each keepalive byte restarts it)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest

from hybridllm import CloudUnavailableError, GenerationParams
from hybridllm.backends.cloud import CloudBackend

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=8, temperature=0)
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
KEEPALIVE_S = 3.0  # how long the server sends keepalives before it closes (the old code waited it out)


def _event(payload: object) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _text(text: str) -> bytes:
    return _event({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


def _serve(conn: socket.socket, mode: str, stop: threading.Event) -> None:
    conn.sendall(HEAD)
    if mode == "tokenthenping":  # a token, then keepalives and no more tokens
        conn.sendall(_text("Hel"))
    end = time.monotonic() + KEEPALIVE_S
    while time.monotonic() < end and not stop.wait(0.05):
        conn.sendall(b": keepalive\n\n")


def _handle(conn: socket.socket, stop: threading.Event) -> None:
    try:
        conn.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next((int(line.partition(b":")[2]) for line in head.split(b"\r\n")[1:]
                       if line.partition(b":")[0].strip().lower() == b"content-length"), 0)
        while len(rest) < length:
            rest += conn.recv(65536)
        _serve(conn, head.split(b" ")[1].decode().split("/")[1], stop)
    except OSError:  # the client gave up: expected
        pass
    finally:
        conn.close()


@pytest.fixture(scope="module")
def server():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=_handle, args=(conn, stop), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(2)
    listener.close()


def test_keepalive_comments_before_the_first_token_do_not_hold_the_call(server):
    """Before: each ": keepalive" restarted httpx's read timeout and the wait for the first token
    had no other bound, so the call waited as long as the server kept the stream alive (for ever
    for a stuck upstream behind a proxy that pings); now read_timeout_s bounds the wait for an
    event, as the README says ("the first token's included")."""
    cloud = CloudBackend(base_url=f"http://127.0.0.1:{server}/ping", model="m", read_timeout_s=0.3,
                         max_retries=0)
    t0 = time.perf_counter()
    with pytest.raises(CloudUnavailableError, match=r"no event within 0.3 s \(keepalives only\)"):
        cloud.generate(MSGS, P)
    assert time.perf_counter() - t0 < KEEPALIVE_S - 1


def test_keepalive_comments_after_the_first_token_do_not_reset_the_stall_timeout(server):
    """Before: any line, a comment too, restarted the stall timeout."""
    cloud = CloudBackend(base_url=f"http://127.0.0.1:{server}/tokenthenping", model="m",
                         read_timeout_s=60, stall_timeout_s=0.3, max_retries=0)
    pieces, t0 = [], time.perf_counter()
    with pytest.raises(CloudUnavailableError, match=r"stalled: no event for 0.3 s"):
        for delta in cloud.stream(MSGS, P):
            pieces.append(delta.text)
    assert pieces == ["Hel"] and time.perf_counter() - t0 < KEEPALIVE_S - 1


def _sse(*events: object) -> httpx.Response:
    body = b"".join(_event(e) for e in events) + b"data: [DONE]\n\n"
    return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


def _cloud(response: httpx.Response) -> CloudBackend:
    return CloudBackend(base_url="http://cloud.test", model="m", max_retries=0,
                        transport=httpx.MockTransport(lambda r: response))


BAD_USAGES = [
    "x",
    {"prompt_tokens": "abc", "completion_tokens": 2},
    {"prompt_tokens": -5, "completion_tokens": 3},
    {"prompt_tokens": 2, "completion_tokens": float("inf")},
    {"prompt_tokens": 2.5, "completion_tokens": 1},
    [3, 2],
]


@pytest.mark.parametrize("usage", BAD_USAGES)
def test_a_bad_count_in_the_finish_chunk_keeps_the_answer(usage, caplog):
    """Before: a count that is not whole numbers in the chunk with the finish_reason (llama.cpp's
    server and others send them together) failed the answer already streamed ("The cloud stream
    broke off: malformed event"; the device then appended to it), Infinity raised a bare
    OverflowError, and a negative count was kept (a call that cost -2 tokens)."""
    finish = {"choices": [{"index": 0, "delta": {"content": " world"}, "finish_reason": "stop"}],
              "usage": usage}
    with caplog.at_level(logging.WARNING, logger="hybridllm.cloud"):
        g = _cloud(_sse({"choices": [{"delta": {"content": "Hello"}}]}, finish)).generate(MSGS, P)
    assert (g.text, g.finish_reason) == ("Hello world", "stop")
    assert (g.usage.prompt_tokens, g.usage.completion_tokens) == (0, 0)  # the pipeline estimates
    assert "token count that is not whole numbers" in caplog.text


@pytest.mark.parametrize("usage", BAD_USAGES)
def test_a_bad_count_in_a_whole_answer_keeps_the_answer(usage):
    """Before: a server that ignores stream=true and sends a bad count had its whole answer
    thrown away as "malformed answer" (and retried)."""
    body = {"choices": [{"message": {"role": "assistant", "content": "whole"}, "finish_reason": "stop"}],
            "usage": usage}
    g = _cloud(httpx.Response(200, content=json.dumps(body).encode(),
                              headers={"content-type": "application/json"})).generate(MSGS, P)
    assert (g.text, g.finish_reason, g.usage.total_tokens) == ("whole", "stop", 0)


def test_good_counts_and_energy_are_still_read_and_bad_energy_is_dropped():
    counts = {"prompt_tokens": 3, "completion_tokens": "2", "energy": {"joules": 1.5, "source": "nvml"}}
    g = _cloud(_sse({"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]},
                    {"choices": [], "usage": counts})).generate(MSGS, P)
    assert (g.usage.prompt_tokens, g.usage.completion_tokens, g.usage.energy_j) == (3, 2, 1.5)
    for joules in (float("nan"), -1.0, float("inf")):
        counts = {"prompt_tokens": 3, "completion_tokens": 2, "energy": {"joules": joules}}
        g = _cloud(_sse({"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]},
                        {"choices": [], "usage": counts})).generate(MSGS, P)
        assert (g.usage.total_tokens, g.usage.energy_j) == (5, None)
