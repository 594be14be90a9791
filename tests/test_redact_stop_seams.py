"""privacy="redact" with stop sequences, over real HTTP on loopback: the cloud writes placeholders
("[EMAIL_1]") and the caller reads the values put back. A stop sequence is about the text the
caller reads. Before: the stop went to the cloud (or the cloud client's emulation, for a model that
refuses it) and was matched against the placeholders, so stop "@" let "alice@example.com" through,
a stop equal to the value never cut, and stop "EMAIL" cut "[EMAIL_1]" to a stray "[". Now the cloud
is sent no stop under redaction and the pipeline cuts the restored text, closes the cloud stream
there, and counts the call once from what streamed (the ledger and stats() alike)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM
from hybridllm.backends.fake import FakeBackend

PROMPT = "My email is alice@example.com, write me a reply."


class Peer(ThreadingHTTPServer):
    """An OpenAI-like peer streaming ``pieces``, one event each. It refuses ``stop`` for the model
    "o-model" (as OpenAI's reasoning models do) and takes it, without applying it, for others.
    ``broken``: the stream ends after the pieces without a finish (a dropped connection).
    ``gate``: after that chunk it waits up to 3 s for the client to hang up (``closed_early``)."""

    daemon_threads = True

    def __init__(self, pieces: list[str]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.pieces = pieces
        self.broken = False
        self.gate: int | None = None
        self.closed_early: bool | None = None
        self.bodies: list[dict] = []
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        peer: Peer = self.server  # type: ignore[assignment]
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        peer.bodies.append(body)
        if "stop" in body and body["model"] == "o-model":
            data = json.dumps({"error": {"message": "Unsupported parameter: 'stop' is not supported "
                                         "with this model.", "type": "invalid_request_error",
                                         "param": "stop", "code": "unsupported_parameter"}}).encode()
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        events: list = [{"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
                        for p in peer.pieces]
        if not peer.broken:
            events += [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                       {"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 40,
                                                 "total_tokens": 60}}, "[DONE]"]
        for i, event in enumerate(events):
            data = event if isinstance(event, str) else json.dumps(event)
            try:
                self.wfile.write(f"data: {data}\n\n".encode())
                self.wfile.flush()
            except OSError:
                return
            if i == peer.gate:
                self.connection.settimeout(3)
                try:
                    peer.closed_early = self.connection.recv(1) == b""
                except (TimeoutError, OSError) as exc:
                    peer.closed_early = not isinstance(exc, TimeoutError)
                if peer.closed_early:
                    return


@pytest.fixture
def make_peer():
    peers: list[Peer] = []

    def make(pieces: list[str]) -> Peer:
        peers.append(Peer(pieces))
        return peers[-1]

    yield make
    for p in peers:
        p.shutdown()
        p.server_close()


def _llm(peer: Peer, model: str, **kw) -> HybridLLM:
    device = kw.pop("device", None) or FakeBackend(reply=lambda m: "from the device")
    return HybridLLM(edge=device, cloud_url=peer.url, cloud_model=model, cache=False, cloud_max_retries=0,
                     privacy="redact", **kw)


@pytest.mark.parametrize("model", ["o-model", "gpt-4o"])  # stop emulated by the client / taken by the cloud
@pytest.mark.parametrize(("stop", "want"), [
    ("@", "Write to alice"),  # inside the restored value
    ("alice@example.com", "Write to "),  # the value itself
    ("EMAIL", "Write to alice@example.com now."),  # only in the placeholder: never seen, never cut
])
def test_a_stop_sequence_is_matched_in_the_text_the_caller_reads(make_peer, model, stop, want):
    peer = make_peer(["Write to [EMA", "IL_1] now.", " More after."])
    with _llm(peer, model) as llm:
        whole = llm.chat(PROMPT, route="cloud", stop=[stop])
        stream = llm.stream(PROMPT, route="cloud", stop=[stop])
        texts = [ch.text for ch in stream]
    assert "alice@example.com" not in json.dumps(peer.bodies)  # still redacted for the cloud
    assert [b.get("stop") for b in peer.bodies] == [None, None]  # the cloud is sent none
    if stop == "EMAIL":  # the cloud's own end: its answer in full, restored
        want += " More after."
    assert (whole.text, whole.finish_reason, whole.route) == (want, "stop", "cloud")
    assert ("".join(texts), stream.completion.text, stream.completion.finish_reason) == (want, want, "stop")


def test_the_stream_is_closed_at_the_stop_and_counted_once(make_peer):
    """The pipeline hangs up at the stop (the peer sees the connection close, not a read to the
    end); the cloud's count never comes, so the call is the prompt plus what streamed, the same
    in the answer's usage, the ledger and stats()."""
    peer = make_peer(["Write to [EMAIL_1]", " now.", " More", " and more."])
    peer.gate = 0  # after the chunk with the stop, wait for the client to hang up
    with _llm(peer, "gpt-4o", max_cloud_tokens_per_day=100_000) as llm:
        start = time.monotonic()
        answer = llm.chat(PROMPT, route="cloud", stop="@")
        took = time.monotonic() - start
        stats = llm.stats()
    assert (answer.text, answer.finish_reason) == ("Write to alice", "stop")
    assert took < 2.5  # not the peer's 3 s wait for a hang-up
    deadline = time.monotonic() + 5
    while peer.closed_early is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert peer.closed_early is True
    assert answer.usage.total_tokens > 0 and answer.usage.total_tokens != 60  # the estimate, not the count
    assert stats["cloud_tokens"] == answer.usage.total_tokens == stats["budget"]["tokens_day"]


def test_async_stream_cut_at_the_stop(make_peer):
    import asyncio

    peer = make_peer(["Mail [EMAIL_1]", " today."])

    async def run(llm: HybridLLM) -> tuple[str, str | None]:
        async with AsyncHybridLLM.wrap(llm).stream(PROMPT, route="cloud", stop=["@"]) as s:
            text = "".join([ch.text async for ch in s])
        return text, s.completion.finish_reason

    with _llm(peer, "o-model") as llm:
        assert asyncio.run(run(llm)) == ("Mail alice", "stop")


def test_a_cloud_that_breaks_before_the_stop_is_finished_by_the_device_from_what_was_shown(make_peer):
    """The text held back because it may start a stop sequence ("no" of "now!") is dropped with
    the broken stream, as the cloud client drops its own: the device continues from the text the
    caller saw, and its continuation is cut at the stop too."""
    peer = make_peer(["Write to [EMAIL_1] ", "no"])
    peer.broken = True
    device = FakeBackend(reply=lambda m: "later. now! not this")
    with _llm(peer, "gpt-4o", device=device) as llm:
        answer = llm.chat(PROMPT, route="cloud", stop=["now!"])
    assert answer.route == "cloud->edge", answer.reason
    assert device.continued == ["Write to alice@example.com "]
    assert (answer.text, answer.finish_reason) == ("Write to alice@example.com  later. ", "stop")


def test_an_openai_client_through_the_proxy_gets_the_restored_answer_cut_at_its_stop(make_peer):
    """End to end over real HTTP: the official openai client -> ``hybridllm.proxy`` under uvicorn
    (with privacy="redact") -> the pipeline -> the cloud client -> the peer; streamed and not."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from hybridllm.proxy import create_app
    from tests.cloud_server.api.helpers import ThreadServer

    peer = make_peer(["Write to [EMA", "IL_1] now.", " More after."])
    llm = _llm(peer, "o-model")
    proxy = ThreadServer(create_app(llm)).start()
    try:
        sdk = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="none", max_retries=0)
        body = {"model": "hybridllm", "messages": [{"role": "user", "content": PROMPT}],
                "stop": ["@"], "extra_body": {"hybridllm": {"route": "cloud"}}}
        full = sdk.chat.completions.create(**body)
        text, finish = "", None
        for event in sdk.chat.completions.create(**body, stream=True):
            if event.choices:
                text += event.choices[0].delta.content or ""
                finish = event.choices[0].finish_reason or finish
    finally:
        proxy.stop()
        llm.close()
    assert (full.choices[0].message.content, full.choices[0].finish_reason) == ("Write to alice", "stop")
    assert (text, finish) == ("Write to alice", "stop")
    assert [b.get("stop") for b in peer.bodies] == [None, None]


def test_a_half_open_circuit_closes_on_an_answer_cut_at_the_stop(make_peer):
    """After an outage the next request is the endpoint's probe. An answer the pipeline cut at the
    stop (closing the cloud stream) is the endpoint answering: the circuit closes. Before, it
    counted as no verdict, and with every request cut at a stop the circuit stayed half-open,
    sending all but one request at a time to the device."""
    peer = make_peer(["Write to [EMAIL_1]", " now.", " More."])
    with _llm(peer, "gpt-4o") as llm:
        breaker = llm.cloud.endpoints[0].breaker
        breaker.trip()  # the outage
        later = breaker._clock() + 3600
        breaker._clock = lambda: later  # its wait is over: the next request probes
        assert breaker.state == "half-open"
        answer = llm.chat(PROMPT, route="cloud", stop="@")
        assert (answer.text, answer.route) == ("Write to alice", "cloud")
        assert breaker.state == "closed"
