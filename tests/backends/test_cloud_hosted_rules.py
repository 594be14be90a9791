"""The cloud client against the request rules of hosted OpenAI-compatible APIs, over real HTTP: a
model that wants ``max_completion_tokens`` and takes sampling only at its default (OpenAI's
reasoning models), and a server that does not know ``stream_options`` (older Azure API versions).
The peer's behaviour is the first segment of the base URL (``http://127.0.0.1:PORT/<mode>``)."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybridllm import GenerationParams, HybridLLM, InvalidRequestError
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend

MSGS = [{"role": "user", "content": "hi"}]
# the fields of OpenAI's chat completions API a request of ours may carry; anything else is unknown
OPENAI_FIELDS = {"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
                 "temperature", "top_p", "seed", "stop"}
# an API version from before stream_options and max_completion_tokens
OLD_FIELDS = OPENAI_FIELDS - {"stream_options", "max_completion_tokens"}
ANSWER = "a fine answer from the cloud"  # 28 characters: 7 tokens at about 4 characters a token
SERVER_USAGE = {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}


def _error(status: int, message: str, param: str | None, code: str | None) -> tuple[int, dict]:
    return status, {"error": {"message": message, "type": "invalid_request_error", "param": param,
                              "code": code}}


def _refusal(mode: str, body: dict) -> tuple[int, dict] | None:
    """What the peer answers a request it refuses (None: it answers it)."""
    known = OLD_FIELDS if mode == "azure-old" else OPENAI_FIELDS
    unknown = sorted(set(body) - known)
    if unknown:  # api.openai.com and Azure: every unknown field in one message
        s = "s" if len(unknown) > 1 else ""
        return _error(400, f"Unrecognized request argument{s} supplied: {', '.join(unknown)}", None, None)
    if mode == "reasoning" and body["model"] != "gpt-4o":  # a reasoning model: one refusal at a time
        if "max_tokens" in body:
            return _error(400, "Unsupported parameter: 'max_tokens' is not supported with this model. "
                               "Use 'max_completion_tokens' instead.", "max_tokens", "unsupported_parameter")
        if body.get("max_completion_tokens", 0) > 4096:
            return _error(400, "Invalid 'max_completion_tokens': integer above maximum value. Expected a "
                               f"value <= 4096, but got {body['max_completion_tokens']} instead.",
                          "max_completion_tokens", "integer_above_max_value")
        for name in ("temperature", "top_p"):
            if name in body and body[name] != 1:
                return _error(400, f"Unsupported value: '{name}' does not support {body[name]} with "
                                   "this model. Only the default (1) value is supported.", name,
                              "unsupported_value")
    if mode == "range1" and body.get("temperature", 0) > 1:  # a known field, a value it refuses
        return _error(400, "Invalid value for 'temperature': must be between 0 and 1.", "temperature",
                      "invalid_value")
    return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        mode = self.path.split("/")[1]
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        self.server.hits.append((mode, body))  # type: ignore[attr-defined]
        refused = _refusal(mode, body)
        if refused is not None:
            return self._raw(refused[0], "application/json", json.dumps(refused[1]).encode())
        events = [{"choices": [{"delta": {"content": ANSWER}}]},
                  {"choices": [{"delta": {}, "finish_reason": "stop"}]}]
        if (body.get("stream_options") or {}).get("include_usage"):  # as OpenAI: usage only when asked
            events.append({"choices": [], "usage": SERVER_USAGE})
        sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self._raw(200, "text/event-stream", sse.encode())

    def _raw(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.hits = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def hits(server):
    server.hits.clear()
    return server.hits


def _url(server, mode: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/{mode}"


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "hybridllm.cloud"]


# -- max_tokens -> max_completion_tokens ---------------------------------------------------------


def test_a_model_that_wants_max_completion_tokens_gets_it_once_asked(server, hits, caplog):
    """Before: "Unsupported parameter: 'max_tokens'" was the caller's InvalidRequestError on every
    request to such a model."""
    cloud = CloudBackend(base_url=_url(server, "reasoning"), model="o-model", max_retries=0)
    params = GenerationParams(max_tokens=64, temperature=1.0, top_p=1.0, top_k=0, seed=5)
    with caplog.at_level(logging.WARNING, logger="hybridllm.cloud"):
        first = cloud.generate(MSGS, params)
        second = cloud.generate(MSGS, params)
    assert first.text == ANSWER and second.text == ANSWER
    sent = [{k: b.get(k) for k in ("max_tokens", "max_completion_tokens")} for _, b in hits]
    assert sent == [{"max_tokens": 64, "max_completion_tokens": None},
                    {"max_tokens": None, "max_completion_tokens": 64},  # the same value, its new name
                    {"max_tokens": None, "max_completion_tokens": 64}]  # remembered: asked at once
    assert hits[2][1]["seed"] == 5 and hits[2][1]["temperature"] == 1.0  # nothing else changed
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "does not accept max_tokens" in warnings[0], warnings
    assert "max_completion_tokens" in warnings[0]
    assert cloud.endpoints[0].breaker.state == "closed" and cloud.endpoints[0].failures == 0


def test_a_bad_max_completion_tokens_stays_the_callers_error(server, hits):
    cloud = CloudBackend(base_url=_url(server, "reasoning"), model="o-model")
    params = GenerationParams(max_tokens=9999, temperature=1.0, top_p=1.0, top_k=0)
    with pytest.raises(InvalidRequestError, match=r"HTTP 400\): Invalid 'max_completion_tokens'.*<= 4096"):
        cloud.generate(MSGS, params)
    assert [b.get("max_completion_tokens") for _, b in hits] == [None, 9999]  # renamed once, then refused


def test_the_rules_of_one_model_do_not_teach_another(server, hits):
    """The refusals are the model's: the same endpoint serving another model is asked as before."""
    cloud = CloudBackend(base_url=_url(server, "reasoning"), model="o-model", max_retries=0)
    params = GenerationParams(max_tokens=8, temperature=0.5, top_p=0.9, top_k=0)
    assert cloud.generate(MSGS, params).text == ANSWER  # learns max_tokens, temperature, top_p
    cloud._model = "gpt-4o"  # the same endpoint, another model (as a model found by GET /models is)
    assert cloud.generate(MSGS, params).text == ANSWER
    assert len(hits) == 5
    assert {k: hits[-1][1].get(k) for k in ("max_tokens", "temperature", "top_p")} == {
        "max_tokens": 8, "temperature": 0.5, "top_p": 0.9}


# -- temperature and top_p only at the model's default -------------------------------------------


def test_the_default_config_reaches_a_reasoning_model_through_the_client(server, hits, caplog):
    """HybridLLM's defaults (temperature 0.7, top_p 0.95, top_k 40) against a reasoning model: top_k
    is unknown, max_tokens wants its new name, temperature and top_p are refused as not the
    default. Before: InvalidRequestError for every cloud request. Now the cloud answers; the first
    request learns each refusal (5 POSTs), later ones go at once, and one warning per field says
    the model samples at its default."""
    device = FakeBackend(reply=lambda m: "from the device")
    with caplog.at_level(logging.WARNING, logger="hybridllm.cloud"), \
            HybridLLM(edge=device, cloud_url=_url(server, "reasoning"), cloud_model="o-model",
                      cache=False) as llm:
        first = llm.chat("hi", route="cloud")
        second = llm.chat("hi again", route="cloud")
        breaker = llm.cloud.endpoints[0].breaker
        assert breaker.state == "closed"
    for c in (first, second):
        assert (c.text, c.route) == (ANSWER, "cloud"), c
        assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (11, 5)  # the server's own count
    assert len(hits) == 6, [sorted(b) for _, b in hits]
    last = hits[-1][1]
    assert not {"top_k", "max_tokens", "temperature", "top_p"} & set(last)
    assert last["max_completion_tokens"] == hits[0][1]["max_tokens"]
    assert hits[0][1]["temperature"] == 0.7 and hits[0][1]["top_p"] == 0.95  # what the config sends
    warnings = _warnings(caplog)
    assert len(warnings) == 4, warnings  # top_k, max_tokens, temperature, top_p: once each
    temperature = next(w for w in warnings if "does not accept temperature 0.7" in w)
    assert "server's default temperature" in temperature
    assert any("does not accept top_p 0.95" in w for w in warnings), warnings


def test_a_bad_temperature_for_a_server_that_knows_it_stays_the_callers_error(server, hits):
    """"Invalid value" is not "Unsupported value": the field is not dropped, nor sent again."""
    cloud = CloudBackend(base_url=_url(server, "range1"), model="m")
    with pytest.raises(InvalidRequestError, match=r"Invalid value for 'temperature'"):
        cloud.generate(MSGS, GenerationParams(max_tokens=8, temperature=1.5, top_k=0))
    assert len(hits) == 1 and hits[0][1]["temperature"] == 1.5
    assert cloud.generate(MSGS, GenerationParams(max_tokens=8, temperature=0.5, top_k=0)).text == ANSWER
    assert hits[-1][1]["temperature"] == 0.5  # still sent: nothing was learned from the refusal


def test_a_temperature_out_of_range_is_refused_before_anything_is_sent(server, hits):
    device = FakeBackend(reply=lambda m: "from the device")
    with HybridLLM(edge=device, cloud_url=_url(server, "reasoning"), cloud_model="o-model",
                   cache=False) as llm:
        with pytest.raises(InvalidRequestError, match="temperature must be between 0 and 2"):
            llm.chat("hi", route="cloud", temperature=3)
    assert hits == []


# -- stream_options ------------------------------------------------------------------------------


def test_a_server_without_stream_options_answers_and_its_usage_is_estimated(server, hits, caplog):
    """An older API version refuses stream_options as unknown. Before: InvalidRequestError on every
    request. Now it is sent again without it, and never again; the cloud's count does not come, so
    the pipeline counts the call as the prompt (the device's count) plus what streamed, ~4
    characters a token, in its cost and the stats."""
    device = FakeBackend(reply=lambda m: "from the device")
    with caplog.at_level(logging.WARNING, logger="hybridllm.cloud"), \
            HybridLLM(edge=device, cloud_url=_url(server, "azure-old"), cloud_model="gpt-4",
                      cache=False, price_per_1k_tokens=1.0) as llm:
        first = llm.chat("hi", route="cloud")
        second = llm.chat("hi again", route="cloud")
        stats = llm.stats()
    assert (first.text, first.route) == (ANSWER, "cloud") and (second.text, second.route) == (ANSWER, "cloud")
    assert [("stream_options" in b, "top_k" in b) for _, b in hits] == [(True, True), (False, False),
                                                                       (False, False)]
    streamed = len(ANSWER) // 4  # one delta of 28 characters: 7 tokens
    assert streamed == 7
    prompts = [device.count_tokens([{"role": "user", "content": t}]) for t in ("hi", "hi again")]
    assert stats["cloud_tokens"] == sum(prompts) + 2 * streamed, (stats, prompts)
    assert first.cost_usd == pytest.approx((prompts[0] + streamed) / 1000)
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "stream_options" in warnings[0] and "estimated" in warnings[0], warnings


def test_a_server_that_takes_stream_options_still_reports_its_own_count(server, hits):
    cloud = CloudBackend(base_url=_url(server, "reasoning"), model="o-model", max_retries=0)
    params = GenerationParams(max_tokens=8, temperature=1.0, top_p=1.0, top_k=0)
    answer = cloud.generate(MSGS, params)
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (11, 5)
    assert all(b["stream_options"] == {"include_usage": True} for _, b in hits)


def test_an_answer_from_a_cloud_that_sends_no_count_has_the_estimated_usage(server, hits):
    """Without stream_options the cloud's count never comes: the answer's usage is the estimate the
    budget and the stats count (the prompt, the device's count, plus what streamed), not 0/0."""
    device = FakeBackend(reply=lambda m: "from the device")
    with HybridLLM(edge=device, cloud_url=_url(server, "azure-old"), cloud_model="gpt-4",
                   cache=False) as llm:
        answer = llm.chat("hi", route="cloud")
        stats = llm.stats()
    prompt = device.count_tokens([{"role": "user", "content": "hi"}])
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (prompt, len(ANSWER) // 4)
    assert answer.usage.total_tokens == stats["cloud_tokens"]
