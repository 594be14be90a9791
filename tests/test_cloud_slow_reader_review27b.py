"""A reader that pauses between chunks of a cloud answer is not a cloud that stalls.

Before: the stall timeout (``cloud_stall_timeout_s``, 10 s by default) was measured from the
cloud's last event to the next read, so the time the caller held a chunk counted as the server's
silence. A caller that paused longer than that between two chunks (slow work per chunk, a slow
client of ``hybridllm serve``) had a healthy answer broken off as "stalled: no event for 10 s",
though the rest of it was already waiting in the socket: the device wrote the rest of the answer
in the cloud's place (route ``cloud->edge``) and the endpoint was counted a failure towards its
circuit. Now the time the reader holds a chunk does not count; a cloud that really goes quiet is
still broken off. Real HTTP: a small server on a socket that streams the answer at once.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable

from hybridllm import AsyncHybridLLM, GenerationParams, HybridLLM
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend

from .test_combinations import CloudRouter

STALL_S = 0.3  # the stall timeout of these tests
PAUSE_S = 1.0  # the reader's pause: longer than STALL_S
WORDS = [f"w{i} " for i in range(6)]
MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]


def sse(payload: object) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def text_event(text: str | None = None, finish: str | None = None) -> bytes:
    delta = {"content": text} if text else {}
    return sse({"object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def respond(writer: asyncio.StreamWriter, status: int, body: bytes = b"",
            headers: dict[str, str] | None = None) -> None:
    head = {"content-type": "application/json", "content-length": str(len(body)), **(headers or {})}
    writer.write(f"HTTP/1.1 {status} X\r\n".encode()
                 + "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode() + b"\r\n" + body)


def stream_head(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")


class Server:
    """An OpenAI-compatible endpoint on 127.0.0.1, on its own loop thread: GET /v1/models lists
    "m"; each POST (kept in ``posts``) is answered by ``handler``, then the connection closes."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.posts: list[bytes] = []
        self.loop = asyncio.new_event_loop()
        self.stopping: asyncio.Event | None = None
        self.conns: set[asyncio.Task] = set()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(5)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.stopping = asyncio.Event()
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._conn, "127.0.0.1", self.port))
        ready.set()
        self.loop.run_forever()

    async def quiet(self, seconds: float) -> None:
        """Send nothing for ``seconds`` (less once the test stops the server)."""
        assert self.stopping is not None
        try:
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except TimeoutError:
            pass

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.conns.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            while line := await reader.readline():
                path = line.decode().split(" ")[1]
                length = 0
                while (h := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = h.decode().partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                if path.endswith("/models"):
                    respond(writer, 200, MODELS)
                    await writer.drain()
                    continue
                self.posts.append(body)
                await self.handler(reader, writer, self)
                await writer.drain()
                break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.conns.discard(asyncio.current_task())  # type: ignore[arg-type]

    def stop(self) -> None:
        async def down() -> None:
            assert self.stopping is not None
            self.stopping.set()
            self.server.close()
            if self.conns:
                await asyncio.wait(list(self.conns), timeout=5)

        asyncio.run_coroutine_threadsafe(down(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def whole_answer(reader, writer, server) -> None:
    """The whole answer at once (it waits in the socket for the reader), then [DONE]."""
    stream_head(writer)
    for word in WORDS:
        writer.write(text_event(word))
    writer.write(text_event(finish="stop"))
    writer.write(sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 6}}))
    writer.write(b"data: [DONE]\n\n")
    await writer.drain()
    await server.quiet(PAUSE_S * 2)  # the connection stays open while the reader pauses


async def two_words_then_quiet(reader, writer, server) -> None:
    """Two words, then nothing for 10 s (a hung server)."""
    stream_head(writer)
    writer.write(text_event(WORDS[0]) + text_event(WORDS[1]))
    await writer.drain()
    await server.quiet(10)


def _client(server: Server, cls=HybridLLM):
    return cls(edge=FakeBackend(), cloud_url=server.url, policy=CloudRouter(), cache=False,
               cloud_stall_timeout_s=STALL_S, cloud_read_timeout_s=5)


def _failures(llm) -> int:
    return llm.cloud.endpoints[0].breaker._failures


def test_a_sync_reader_that_pauses_longer_than_the_stall_timeout_gets_the_cloud_answer_whole():
    server = Server(whole_answer)
    llm = _client(server)
    try:
        with llm.stream("hi") as stream:
            for i, _ in enumerate(stream):
                if i == 1:
                    time.sleep(PAUSE_S)
        c = stream.completion
        # before: route "cloud->edge", "stalled: no event for 0.3 s", the device wrote the rest
        assert c.route == "cloud", c.reason
        assert c.text == "".join(WORDS)
        assert c.usage.completion_tokens == 6
        assert _failures(llm) == 0  # the endpoint did nothing wrong
        assert llm.stats()["cloud_tokens"] == 11
    finally:
        llm.close()
        server.stop()


def test_an_async_reader_that_pauses_gets_the_cloud_answer_whole():
    server = Server(whole_answer)

    async def main():
        async with _client(server, AsyncHybridLLM) as llm:
            async with llm.stream("hi") as stream:
                i = 0
                async for _ in stream:
                    i += 1
                    if i == 2:
                        await asyncio.sleep(PAUSE_S)
            return stream.completion, _failures(llm)

    try:
        c, failures = asyncio.run(main())
    finally:
        server.stop()
    assert c.route == "cloud" and c.text == "".join(WORDS), c.reason
    assert failures == 0


def test_the_cloud_backend_own_sync_stream_with_a_pause_between_next_calls():
    server = Server(whole_answer)
    cloud = CloudBackend(base_url=server.url, model="m", stall_timeout_s=STALL_S, max_retries=0)
    try:
        deltas = cloud.stream([{"role": "user", "content": "hi"}], GenerationParams(max_tokens=16))
        first = next(deltas)
        time.sleep(PAUSE_S)
        rest = list(deltas)  # before: CloudUnavailableError "stalled: no event for 0.3 s"
        deltas.close()
    finally:
        cloud.close()
        server.stop()
    assert first.text + "".join(d.text for d in rest) == "".join(WORDS)
    assert rest[-1].finish_reason == "stop"


def test_a_cloud_that_goes_quiet_is_still_broken_off_after_the_reader_pauses():
    server = Server(two_words_then_quiet)
    llm = _client(server)
    try:
        t0 = time.monotonic()
        with llm.stream("hi") as stream:
            for i, _ in enumerate(stream):
                if i == 0:
                    time.sleep(PAUSE_S)
        c = stream.completion
        took = time.monotonic() - t0
    finally:
        llm.close()
        server.stop()
    assert c.route == "cloud->edge" and "stalled: no event for 0.3 s" in c.reason, c.reason
    assert c.text.startswith(WORDS[0] + WORDS[1])
    assert took < PAUSE_S + 3  # broken off within the stall timeout after the pause, not at 10 s
