"""An async stream read with anext() and then dropped half way is collected cleanly: its cloud
call is closed once, from the top, with nothing logged. AsyncStream kept the generator anext()
read on itself while that generator's frame held the stream; the garbage collector took the cycle
with every generator under it at once and closed each on its own while the one above closed it:
eight "aclose(): asynchronous generator is already running" errors went to the loop's handler."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import threading
import time

from hybridllm import AsyncHybridLLM
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend


def _sse_server() -> tuple[str, threading.Event, socket.socket]:
    """A cloud that streams slowly; ``gone`` is set once the client hangs up."""
    gone = threading.Event()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def handle(conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        try:
            for i in range(500):
                event = {"choices": [{"delta": {"content": f"w{i} "}}]}
                conn.sendall(f"data: {json.dumps(event)}\n\n".encode())
                time.sleep(0.02)
        except OSError:
            gone.set()
        finally:
            conn.close()

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}", gone, srv


def test_a_dropped_half_read_async_stream_is_closed_cleanly() -> None:
    url, gone, srv = _sse_server()
    errors: list[dict] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        async with AsyncHybridLLM(edge=FakeBackend(reply=lambda _m: "x"),
                                  cloud=CloudBackend(base_url=url, model="m"), cache=False) as llm:
            s = llm.stream("hi", route="cloud")
            first = await anext(s)
            assert first.route == "cloud"
            del s
            gc.collect()
            for _ in range(50):  # the close runs on the loop
                await asyncio.sleep(0.05)
                if gone.is_set():
                    break
            await asyncio.sleep(0.2)

    try:
        asyncio.run(main())
    finally:
        srv.close()
    assert [str(e.get("exception") or e.get("message")) for e in errors] == []
    assert gone.wait(5), "the dropped stream's cloud call was never closed"


def test_anext_then_async_for_reads_on_and_the_end_repeats() -> None:
    async def main() -> tuple[str, object]:
        async with AsyncHybridLLM(edge=FakeBackend(reply=lambda _m: "one two three"), cache=False) as llm:
            s = llm.stream("hi", route="edge")
            text = (await anext(s)).text
            async for chunk in s:
                text += chunk.text
            try:
                await anext(s)
            except StopAsyncIteration as exc:
                return text, exc
            return text, None

    text, end = asyncio.run(main())
    assert text == "one two three"
    assert isinstance(end, StopAsyncIteration)
