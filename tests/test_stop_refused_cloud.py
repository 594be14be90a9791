"""A hosted model that refuses ``stop`` (OpenAI's reasoning models: 400 "Unsupported parameter: 'stop'
is not supported with this model."), over real HTTP on loopback. Before: InvalidRequestError on every
request with stop sequences. Now the client leaves ``stop`` out for that endpoint and model (once
learned, with one warning), cuts the answer at the earliest stop sequence itself, ends it with
finish_reason "stop", and closes the stream there. A bad stop value stays the caller's error."""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybridllm import GenerationParams, HybridLLM, InvalidRequestError
from hybridllm._types import estimate_tokens
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend

MSGS = [{"role": "user", "content": "hi"}]
SERVER_USAGE = {"prompt_tokens": 11, "completion_tokens": 50, "total_tokens": 61}
TAKES_STOP = "gpt-4o"  # the one model of this peer that takes stop (at most one sequence)


class Peer(ThreadingHTTPServer):
    """An OpenAI-like peer. ``pieces``: the answer's chunks (one event each); ``whole``: it ignores
    "stream": true and answers one JSON completion; ``finish``: its finish_reason. It refuses stop
    for every model but TAKES_STOP; that one refuses more than one sequence as a bad value. After
    the chunk at index ``gate`` it waits (up to 3 s) for the client to close the connection and
    records whether it did; if not, it sends the rest."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.pieces: list[str] = ["fine"]
        self.whole = False
        self.finish = "stop"
        self.gate: int | None = None
        self.closed_early: bool | None = None
        self.bodies: list[dict] = []
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):  # HTTP/1.0: an event stream ends when the connection closes
    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _refuse(self, message: str, code: str) -> None:
        self._json(400, {"error": {"message": message, "type": "invalid_request_error", "param": "stop",
                                   "code": code}})

    def do_POST(self) -> None:
        peer: Peer = self.server  # type: ignore[assignment]
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        peer.bodies.append(body)
        if "stop" in body and body["model"] != TAKES_STOP:
            return self._refuse("Unsupported parameter: 'stop' is not supported with this model.",
                                "unsupported_parameter")
        if len(body.get("stop") or []) > 1:
            return self._refuse(f"Invalid 'stop': array too long. Expected an array with maximum length "
                                f"1, but got an array with length {len(body['stop'])} instead.",
                                "array_above_max_length")
        if peer.whole:
            return self._json(200, {"choices": [{"index": 0, "finish_reason": peer.finish, "message": {
                "role": "assistant", "content": "".join(peer.pieces)}}], "usage": SERVER_USAGE})
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        events = [{"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
                  for p in peer.pieces]
        events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": peer.finish}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({"choices": [], "usage": SERVER_USAGE})
        for i, event in enumerate([*events, "[DONE]"]):
            data = event if isinstance(event, str) else json.dumps(event)
            try:
                self.wfile.write(f"data: {data}\n\n".encode())
                self.wfile.flush()
            except OSError:
                return
            if i == peer.gate:
                self.connection.settimeout(3)
                try:
                    peer.closed_early = self.connection.recv(1) == b""  # b"": the client closed it
                except (TimeoutError, OSError) as exc:
                    peer.closed_early = not isinstance(exc, TimeoutError)
                if peer.closed_early:
                    return


@pytest.fixture
def peer():
    srv = Peer()
    yield srv
    srv.shutdown()
    srv.server_close()


def _cloud(peer: Peer, model: str = "o-model") -> CloudBackend:
    return CloudBackend(base_url=peer.url, model=model, max_retries=0)


def _params(*stop: str) -> GenerationParams:
    return GenerationParams(max_tokens=64, temperature=1.0, top_p=1.0, top_k=0, stop=stop)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "hybridllm.cloud"]


def test_a_refused_stop_is_left_out_and_the_client_cuts_the_stream_at_it(peer, caplog):
    """Held back only what may start the stop sequence ("E", then "EN"), across chunk boundaries;
    nothing that is later cut is ever passed on; the second request sends no stop at once."""
    peer.pieces = ["Hello E", "ach", " wor", "ld. EN", "D more text", " and more"]
    cloud = _cloud(peer)
    with caplog.at_level(logging.WARNING, logger="hybridllm.cloud"):
        deltas = list(cloud.stream(MSGS, _params("END")))
        again = cloud.generate(MSGS, _params("END"))
    texts = [d.text for d in deltas if d.text]
    assert texts == ["Hello ", "Each", " wor", "ld. "], texts
    assert deltas[-1].finish_reason == "stop" and again.finish_reason == "stop"
    assert again.text == "Hello Each world. "
    assert [b.get("stop") for b in peer.bodies] == [["END"], None, None]  # remembered: asked at once
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "does not accept stop" in warnings[0], warnings
    assert "cuts each answer at its stop sequences itself" in warnings[0]
    assert cloud.endpoints[0].breaker.state == "closed" and cloud.endpoints[0].failures == 0


def test_a_stop_that_never_comes_loses_nothing_and_keeps_the_clouds_finish(peer):
    peer.pieces, peer.finish = ["no stop ", "here E"], "length"
    cloud = _cloud(peer)
    deltas = list(cloud.stream(MSGS, _params("END")))
    # "E" may start "END": held until the stream ends, then passed on
    assert [d.text for d in deltas if d.text] == ["no stop ", "here ", "E"]
    assert deltas[-1].finish_reason == "length"  # the cloud's own: it hit max_tokens
    assert (deltas[-1].usage.prompt_tokens, deltas[-1].usage.completion_tokens) == (11, 50)


def test_of_two_stops_the_earliest_in_the_text_wins(peer):
    peer.pieces = ["Hel", "lo wor", "ld"]  # "lo" (listed second) starts before "world"
    cloud = _cloud(peer)
    answer = cloud.generate(MSGS, _params("world", "lo"))
    assert (answer.text, answer.finish_reason) == ("Hel", "stop")


def test_the_client_closes_the_stream_at_the_stop_and_reads_no_further(peer):
    peer.pieces = ["one ", "two STOP three", " four", " five"]
    peer.gate = 1  # after the chunk with the stop, the peer waits for the client to hang up
    cloud = _cloud(peer)
    cloud.generate(MSGS, _params("STOP"))  # learns the refusal
    start = time.monotonic()
    answer = cloud.generate(MSGS, _params("STOP"))
    assert (answer.text, answer.finish_reason) == ("one two ", "stop")
    assert time.monotonic() - start < 2.5  # not the peer's 3 s wait for a hang-up
    deadline = time.monotonic() + 5
    while peer.closed_early is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert peer.closed_early is True
    # closed before the cloud's count: the call is counted from what the cloud sent ("one ", and
    # "two STOP three" past the stop too: 14 characters, ceil(14 / 4) = 4 tokens), the prompt estimated
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (estimate_tokens(MSGS), 1 + 4)


def test_a_whole_answer_is_cut_too_and_keeps_the_clouds_count_once(peer):
    """A peer that ignores "stream": true answers one JSON completion: cut the same way; its usage
    (the whole answer it generated and bills) is the call's count, counted once."""
    peer.whole, peer.pieces, peer.finish = True, ["The answer. END and what followed"], "length"
    device = FakeBackend(reply=lambda m: "from the device")
    with HybridLLM(edge=device, cloud_url=peer.url, cloud_model="o-model", cache=False,
                   cloud_max_retries=0, price_per_1k_tokens=1.0) as llm:
        first = llm.chat("hi", route="cloud", stop=["END"])
        second = llm.chat("hi", route="cloud", stop=["END"])
        stats = llm.stats()
    for c in (first, second):
        assert (c.text, c.route, c.finish_reason) == ("The answer. ", "cloud", "stop"), c
        assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (11, 50)  # the cloud's, as sent
        assert c.cost_usd == pytest.approx(61 / 1000)
    assert stats["cloud_tokens"] == 2 * 61  # two calls, each its cloud's count once
    assert [b.get("stop") for b in peer.bodies] == [["END"], None, None]


def test_a_stream_closed_at_the_stop_is_counted_once_from_what_the_cloud_sent(peer):
    """The cloud's count never comes on a stream closed at the stop: the call is counted from what
    the cloud sent (the text past the stop too; each piece at least one token, ~4 characters a
    token) and the prompt's estimate, in the answer's usage and in the stats alike, not the
    cloud's count and the estimate both."""
    peer.pieces = ["Hello E", "ach", " wor", "ld. EN", "D more text"]
    device = FakeBackend(reply=lambda m: "from the device")
    with HybridLLM(edge=device, cloud_url=peer.url, cloud_model="o-model", cache=False,
                   cloud_max_retries=0) as llm:
        answer = llm.chat("hi", route="cloud", stop="END")
        stats = llm.stats()
    assert (answer.text, answer.route, answer.finish_reason) == ("Hello Each world. ", "cloud", "stop")
    prompt = estimate_tokens([{"role": "user", "content": "hi"}])
    # "Hello E", "ach", " wor", "ld. EN", "D more text": 7, 3, 4, 6, 11 characters, ceil(n / 4) each
    sent = 2 + 1 + 1 + 2 + 3
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (prompt, sent)
    assert stats["cloud_tokens"] == prompt + sent


def test_the_refusal_is_the_models_another_model_still_gets_stop(peer):
    peer.pieces = ["a b STOP c"]
    cloud = _cloud(peer)
    assert cloud.generate(MSGS, _params("STOP")).text == "a b "
    cloud._model = TAKES_STOP  # the same endpoint, another model (as a model found by GET /models is)
    cloud.generate(MSGS, _params("STOP"))
    assert [b.get("stop") for b in peer.bodies] == [["STOP"], None, ["STOP"]]


def test_a_bad_stop_value_of_a_model_that_takes_stop_stays_the_callers_error(peer, caplog):
    """"Invalid 'stop': array too long" is a value the caller chose, not a field the model does
    not take: not dropped, not applied by the client, nothing learned."""
    cloud = _cloud(peer, TAKES_STOP)
    with caplog.at_level(logging.WARNING, logger="hybridllm.cloud"), \
            pytest.raises(InvalidRequestError, match=r"HTTP 400\): Invalid 'stop': array too long"):
        cloud.generate(MSGS, _params("A", "B"))
    assert [b.get("stop") for b in peer.bodies] == [["A", "B"]]  # asked once, not again without it
    assert _warnings(caplog) == []
    cloud.generate(MSGS, _params("A"))
    assert peer.bodies[-1].get("stop") == ["A"]  # still sent


def test_an_openai_client_through_the_proxy_gets_answers_cut_at_its_stop(peer):
    """End to end over real HTTP: the official openai client -> ``hybridllm.proxy`` under uvicorn
    -> the pipeline -> the cloud client -> a peer that refuses stop; streamed and not."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from hybridllm.proxy import create_app
    from tests.cloud_server.api.helpers import ThreadServer

    peer.pieces = ["Step one.", "\n\nSte", "p two.", "\n\nStep three."]
    device = FakeBackend(reply=lambda m: "from the device")
    llm = HybridLLM(edge=device, cloud_url=peer.url, cloud_model="o-model", cache=False,
                    cloud_max_retries=0)
    proxy = ThreadServer(create_app(llm)).start()
    try:
        sdk = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="none", max_retries=0)
        body = {"model": "hybridllm", "messages": [{"role": "user", "content": "steps?"}],
                "stop": ["\n\nStep"], "extra_body": {"hybridllm": {"route": "cloud"}}}
        full = sdk.chat.completions.create(**body)
        text, finish = "", None
        for event in sdk.chat.completions.create(**body, stream=True):
            if event.choices:
                text += event.choices[0].delta.content or ""
                finish = event.choices[0].finish_reason or finish
    finally:
        proxy.stop()
        llm.close()
    assert full.model_extra["hybridllm"]["route"] == "cloud"
    assert (full.choices[0].message.content, full.choices[0].finish_reason) == ("Step one.", "stop")
    assert (text, finish) == ("Step one.", "stop")
    assert [b.get("stop") for b in peer.bodies] == [["\n\nStep"], None, None]


@pytest.mark.parametrize(("message", "param", "dropped"), [
    ("Unsupported parameter: 'stop' is not supported with this model.", "stop", True),
    ("Unsupported parameter: 'stop' is not supported with this model.", None, True),  # named in quotes
    ("Unsupported value: the stream will stop here for this model.", None, False),  # "stop", a word
    ("Invalid 'stop': array too long. Expected an array with maximum length 4.", "stop", False),
])
def test_only_a_refusal_of_the_field_stop_drops_it(message, param, dropped):
    import httpx

    from hybridllm.backends.cloud_request import _refused_fields

    resp = httpx.Response(400, json={"error": {"message": message, "type": "invalid_request_error",
                                               "param": param, "code": None}})
    body = {"model": "o-model", "messages": MSGS, "stop": ["END"]}
    assert _refused_fields(resp, body) == (frozenset({"stop"}) if dropped else frozenset())
