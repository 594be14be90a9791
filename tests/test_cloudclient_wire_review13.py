"""The cloud client against a raw socket server that misbehaves below HTTP's politeness: bytes
written exactly as scripted (split anywhere, trickled, cut off with a reset), so each case is what
a broken proxy, a buggy OpenAI-compatible server or a hostile network does to a real connection.
The script is chosen by the first segment of the base URL (``http://127.0.0.1:PORT/<mode>``)."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest

from hybridllm import CloudUnavailableError, GenerationParams
from hybridllm.backends.cloud import CloudBackend

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=8, temperature=0)


def _event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _text(text: str) -> bytes:
    return _event({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


FINISH = _event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
DONE = b"data: [DONE]\n\n"


def _head(status: int = 200, ctype: str = "text/event-stream", length: int | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} X", f"content-type: {ctype}", "connection: close"]
    if length is not None:
        lines.append(f"content-length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _reset(conn: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a crashed server or a middlebox does."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def _serve(conn: socket.socket, mode: str, stop: threading.Event) -> None:
    """Write ``mode``'s script. A stream without content-length is read to the connection's close."""
    if mode == "slowheaders-models":  # the model list's answer trickled in (discovery: no model set)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while not stop.wait(0.05):
            conn.sendall(b"x")
    elif mode == "finishthenreset":  # the whole answer, then a reset before the usage and [DONE]
        conn.sendall(_head() + _text("Hello") + _text(" world") + FINISH)
        time.sleep(0.1)
        _reset(conn)
    elif mode == "badusage":  # the whole answer, then a usage chunk with nulls (not numbers)
        usage = {"choices": [], "usage": {"prompt_tokens": None, "completion_tokens": 2}}
        conn.sendall(_head() + _text("Hello") + FINISH + _event(usage) + DONE)
    elif mode == "slowheaders":  # slow loris: the status line, then a header byte at a time, for ever
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while not stop.wait(0.05):
            conn.sendall(b"x")
    elif mode == "endlesserror":  # a 500 whose body never ends (a proxy's runaway error page)
        conn.sendall(_head(500, "text/plain"))
        while not stop.wait(0.01):
            conn.sendall(b"e" * 1000 + b"\n")
    elif mode == "endlessline":  # an event stream that is one line with no end
        conn.sendall(_head())
        while not stop.wait(0.01):
            conn.sendall(b"data: " + b"x" * 100_000)
    elif mode == "jsonasstream":  # a whole completion mislabelled as an event stream
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "whole"},
                                        "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 2, "completion_tokens": 1}}).encode()
        conn.sendall(_head(ctype="text/event-stream", length=len(body)) + body)
    elif mode == "errorasstream":  # HTTP 200, an event stream's type, and an error's JSON as its body
        body = json.dumps({"error": {"message": "model 'm' is overloaded, try later", "code": 503}},
                          indent=2).encode()
        conn.sendall(_head() + body)
    elif mode == "errorafterfinish":  # the whole answer, then an in-band error before the count
        error = {"error": {"message": "The server had an error while streaming.", "type": "server_error"}}
        conn.sendall(_head() + _text("Hello") + FINISH + _event(error) + DONE)
    elif mode == "split":  # events cut at every byte, a UTF-8 character and CRLF endings included
        body = (_text("h\u00e9llo \u4e16\u754c") + FINISH + DONE).replace(b"\n", b"\r\n")
        conn.sendall(_head())
        for i in range(len(body)):
            conn.sendall(body[i:i + 1])
            time.sleep(0.001)
    else:
        conn.sendall(_head(404, "text/plain", 0))
    conn.close()


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
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            rest += conn.recv(65536)
        method, path = head.split(b" ")[:2]
        mode = path.decode().split("/")[1] + ("-models" if method == b"GET" else "")
        _serve(conn, mode, stop)
    except OSError:  # the client gave up: expected in several cases
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


def _cloud(port: int, mode: str, **kw) -> CloudBackend:
    kw.setdefault("max_retries", 0)
    return CloudBackend(base_url=f"http://127.0.0.1:{port}/{mode}", model="m", **kw)


@pytest.fixture
def slept(monkeypatch):
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr("hybridllm.backends.cloud_retry._sleep", sleep)
    return waits


def test_an_event_cut_at_every_byte_with_crlf_and_utf8_reads_whole(server):
    g = _cloud(server, "split").generate(MSGS, P)
    assert (g.text, g.finish_reason) == ("h\u00e9llo \u4e16\u754c", "stop")


def test_a_connection_reset_after_the_answers_end_keeps_the_answer(server):
    """Before: 'The cloud stream broke off ... (ReadError)' after the whole answer had been shown,
    and HybridLLM then had the device append its own answer to it (route 'cloud->edge')."""
    from hybridllm import HybridLLM
    from hybridllm.backends.fake import FakeBackend

    g = _cloud(server, "finishthenreset").generate(MSGS, P)
    assert (g.text, g.finish_reason) == ("Hello world", "stop")
    cloud = _cloud(server, "finishthenreset")
    with HybridLLM(edge=FakeBackend(reply=lambda m: " DEVICE"), cloud=cloud, cache=False) as llm:
        c = llm.chat("hi", route="cloud")
    assert (c.text, c.route) == ("Hello world", "cloud")
    assert cloud.endpoints[0].breaker.state == "closed"


def test_an_error_event_after_the_answers_end_keeps_the_answer(server):
    """Before: 'The cloud stream broke off: the cloud reported an error mid-stream' after the
    whole answer had been shown (the device then appended to it)."""
    g = _cloud(server, "errorafterfinish").generate(MSGS, P)
    assert (g.text, g.finish_reason) == ("Hello", "stop")


def test_a_usage_chunk_with_null_counts_does_not_fail_the_answer(server):
    """Before: the answer was shown whole, then "The cloud stream broke off: malformed event"
    (int(None)) over its last chunk, and the device appended to it."""
    g = _cloud(server, "badusage").generate(MSGS, P)
    assert (g.text, g.finish_reason) == ("Hello", "stop")
    assert g.usage.total_tokens == 0  # no count: the pipeline estimates it


def _bounded(fn, seconds: float):
    """Run ``fn`` in a thread; fail (not hang the suite) when it has not returned in ``seconds``."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_headers_trickled_a_byte_at_a_time_are_bounded_by_the_timeouts(server):
    """Before: each byte restarted httpx's read timeout, so a slow-loris server held the request
    (and the app) for ever."""
    cloud = _cloud(server, "slowheaders", connect_timeout_s=0.5, read_timeout_s=0.5)
    t0 = time.perf_counter()
    with pytest.raises(CloudUnavailableError, match=r"timeout talking to .*within 1.5 s"):
        _bounded(lambda: cloud.generate(MSGS, P), 10)
    assert time.perf_counter() - t0 < 3


def test_an_error_body_without_end_is_cut_off(server):
    """Before: a 500 whose body never ended was read (into memory) for ever."""
    cloud = _cloud(server, "endlesserror", read_timeout_s=0.5)
    with pytest.raises(CloudUnavailableError, match=r"HTTP 500: e{20}"):
        _bounded(lambda: cloud.generate(MSGS, P), 10)


def test_an_event_stream_without_line_breaks_is_cut_off(server, monkeypatch):
    """Before: the line grew in memory (about 10 MB a second here) until the process ran out."""
    monkeypatch.setattr("hybridllm.backends.cloud_stream.MAX_LINE_CHARS", 2**20, raising=False)
    cloud = _cloud(server, "endlessline", read_timeout_s=0.5)
    with pytest.raises(CloudUnavailableError, match=r"sent a line over 1 M characters"):
        _bounded(lambda: cloud.generate(MSGS, P), 10)


def test_a_model_list_trickled_a_byte_at_a_time_is_bounded_too(server):
    """Before: model discovery (no cloud_model set) waited for ever on such a server."""
    cloud = CloudBackend(base_url=f"http://127.0.0.1:{server}/slowheaders", connect_timeout_s=0.5,
                         read_timeout_s=0.5, max_retries=0)
    with pytest.raises(CloudUnavailableError, match=r"could not list models.*within 1 s"):
        _bounded(lambda: cloud.generate(MSGS, P), 10)


def test_an_error_sent_as_an_event_streams_body_is_what_the_failure_says(server, slept):
    """Before: 'the stream ... ended before the answer did', the server's own message thrown away."""
    with pytest.raises(CloudUnavailableError, match=r"ended before the answer did: it sent no event but "
                                                    r"an error: .*overloaded, try later"):
        _cloud(server, "errorasstream").generate(MSGS, P)
    with pytest.raises(CloudUnavailableError, match=r"it sent no event but '\{\"choices\""):
        _cloud(server, "jsonasstream").generate(MSGS, P)
