"""Review 17: the OpenAI mapping of the cloud server (fake engine, in-process uvicorn, the
``openai`` client where it is installed): finish reasons, the context-window 400, neutral values."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from cloud_server.api.server import create_app
from cloud_server.engine.sampling_params import SamplingParams

from .fake_engine import FakeEngine, FakeOutput
from .helpers import ThreadServer, sse_payloads

MSGS = [{"role": "user", "content": "Hi"}]
# the finish reasons OpenAI's types allow (openai.types: CompletionChoice, ChatCompletionChunk)
WIRE_REASONS = {"stop", "length", "content_filter", "tool_calls", "function_call"}


class ScriptedEngine(FakeEngine):
    """Answers every request with ``script``: (text, finish_reason or None) per output; the last
    is the finishing one unless ``finish_last`` is False (a stream cut off without its end)."""

    def __init__(self) -> None:
        super().__init__(max_model_len=64)
        self.script: list[tuple[str, str | None]] = [("Hel", None), ("lo", "stop")]
        self.finish_last = True

    async def _run(self, request_id: str, ids: list[int],
                   params: SamplingParams) -> AsyncIterator[FakeOutput]:
        try:
            self.num_waiting -= 1
            if (on_scheduled := self.on_scheduled.pop(request_id, None)) is not None:
                on_scheduled()  # runs at once: no batch to wait for
            n = 0
            for i, (text, reason) in enumerate(self.script):
                n += len(text)
                last = i == len(self.script) - 1
                finished = last and self.finish_last
                yield FakeOutput(request_id, text, [ord(c) for c in text], finished,
                                 reason if finished else None, len(ids), n)
        finally:
            self.live.discard(request_id)


@pytest.fixture(scope="module")
def engine() -> ScriptedEngine:
    return ScriptedEngine()


@pytest.fixture(scope="module")
def server(engine: ScriptedEngine) -> Iterator[ThreadServer]:
    srv = ThreadServer(create_app(lambda: engine)).start()
    yield srv
    srv.stop()


@pytest.fixture()
def client(server: ThreadServer, engine: ScriptedEngine) -> Iterator[httpx.Client]:
    engine.script, engine.finish_last = [("Hel", None), ("lo", "stop")], True
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def _post(client: httpx.Client, path: str, stream: bool, **body: object) -> httpx.Response:
    extra = {"messages": MSGS} if path.endswith("chat/completions") else {"prompt": "Hi"}
    return client.post(path, json={"model": "fake-model", **extra, "stream": stream, **body})


PATHS = ["/v1/chat/completions", "/v1/completions"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("reason", ["abort", "error", "cancelled"])
def test_an_engine_end_that_is_no_answer_is_an_error_not_a_finish_reason(
    client: httpx.Client, engine: ScriptedEngine, path: str, reason: str
) -> None:
    """The engine's own ends ("abort": dropped by the engine; "error") are not OpenAI finish
    reasons: before, a non-streamed answer came back 200 with ``finish_reason: "abort"`` and its
    text cut short (no value of the openai client's ``finish_reason`` type), and a stream ended on
    such a chunk.
    Now it is a 500 server_error; a stream reports the error in-band and sends no finish."""
    engine.script = [("Hel", None), ("", reason)]
    r = _post(client, path, False)
    assert r.status_code == 500, r.text
    assert r.json()["error"]["type"] == "server_error"
    r = _post(client, path, True)
    assert r.status_code == 200
    events = sse_payloads(r.text.splitlines())
    reasons = [c["finish_reason"] for e in events[:-1] for c in e.get("choices", [])
               if c.get("finish_reason")]
    assert reasons == []
    assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "server_error"


@pytest.mark.parametrize("path", PATHS)
def test_a_stream_the_engine_ends_without_a_finish_is_an_error_not_a_stop(
    client: httpx.Client, engine: ScriptedEngine, path: str
) -> None:
    """An engine stream that runs out before its finishing output (a replica cut off): before,
    the half answer was a 200 with ``finish_reason: "stop"`` (silent truncation), and a stream
    ended with [DONE] but no finish chunk at all."""
    engine.script, engine.finish_last = [("Hel", None), ("lo", None)], False
    r = _post(client, path, False)
    assert r.status_code == 500, r.text
    assert r.json()["error"]["type"] == "server_error"
    events = sse_payloads(_post(client, path, True).text.splitlines())
    assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "server_error"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("reason", ["stop", "length"])
def test_answers_keep_their_finish_reason_and_usage_streamed_or_not(
    client: httpx.Client, engine: ScriptedEngine, path: str, reason: str
) -> None:
    engine.script = [("Hel", None), ("lo", reason)]
    body = _post(client, path, False).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == reason
    assert (choice.get("message") or {}).get("content", choice.get("text")) == "Hello"
    events = sse_payloads(_post(client, path, True, stream_options={"include_usage": True}).text.splitlines())
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"] == []
    usage = {k: v for k, v in events[-2]["usage"].items() if k != "energy"}
    assert usage == {k: v for k, v in body["usage"].items() if k != "energy"}
    assert [c["finish_reason"] for e in events[:-2] for c in e["choices"] if c["finish_reason"]] == [reason]
    plain = sse_payloads(_post(client, path, True).text.splitlines())
    assert not any("usage" in e for e in plain[:-1])  # no usage chunk (nor key) unasked


def test_the_openai_client_reads_every_answer(server: ThreadServer, engine: ScriptedEngine) -> None:
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=10)
    engine.script, engine.finish_last = [("Hel", None), ("", "abort")], True
    with pytest.raises(openai.InternalServerError):
        c.chat.completions.create(model="fake-model", messages=MSGS)  # type: ignore[arg-type]
    engine.script = [("Hel", None), ("lo", "length")]
    out = c.completions.create(model="fake-model", prompt="Hi")
    assert out.choices[0].finish_reason == "length" and out.choices[0].text == "Hello"


@pytest.mark.parametrize("path,param", [("/v1/chat/completions", "messages"), ("/v1/completions", "prompt")])
@pytest.mark.parametrize("size", [64, 70])
def test_a_prompt_that_fills_the_window_alone_names_its_numbers(
    client: httpx.Client, path: str, param: str, size: int
) -> None:
    """No max_tokens and a prompt of the whole window (64 of 64): before, the 400 read "maximum
    context length is 64 tokens. However, you requested 64 tokens (64 in the prompt, 0 for the
    completion)", a request that fits by its own numbers. Now it says the prompt leaves no room."""
    body: dict[str, object] = {"model": "fake-model", "max_tokens": None}
    overhead = len("<user>\n<assistant>") if param == "messages" else 0
    text = "x" * (size - overhead)
    if param == "messages":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    r = client.post(path, json=body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == param
    assert "maximum context length is 64 tokens" in err["message"]
    assert f"{size} tokens" in err["message"] and "no room" in err["message"]
    assert "0 for the completion" not in err["message"]


def test_the_window_check_with_max_tokens_keeps_its_numbers(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": "fake-model", "prompt": "x" * 40, "max_tokens": 30})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "max_tokens"
    assert "you requested 70 tokens (40 in the prompt, 30 for the completion)" in err["message"]


@pytest.mark.parametrize("path", PATHS)
def test_a_logit_bias_of_zeros_is_neutral(client: httpx.Client, path: str) -> None:
    """``logit_bias`` whose biases are all 0 changes nothing (as ``presence_penalty: 0``): before, a
    400. A real bias is served since review 31 (test_sampling_controls_review31.py); a key that is
    no token id is a 400 naming it."""
    assert _post(client, path, False, logit_bias={"50256": 0, "42": 0.0}).status_code == 200
    assert _post(client, path, False, logit_bias={"50256": 0, "42": -100}).status_code == 200
    r = _post(client, path, False, logit_bias={"x42": -100})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"


def test_neutral_legacy_fields_pass_and_others_name_themselves(client: httpx.Client) -> None:
    ok = {"echo": False, "suffix": "", "best_of": 1, "logit_bias": {}}
    assert _post(client, "/v1/completions", False, **ok).status_code == 200
    for name, value in {"echo": True, "suffix": "!", "best_of": 2}.items():
        r = _post(client, "/v1/completions", False, **{name: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == name, (name, r.text)
    r = _post(client, "/v1/completions", False, prompt=["a", "b"])
    assert r.status_code == 400 and "batched prompts" in r.json()["error"]["message"]
    ids = _post(client, "/v1/completions", False, prompt=[[72, 105]])
    assert ids.status_code == 200 and ids.json()["usage"]["prompt_tokens"] == 2
    assert json.loads(ids.text)["choices"][0]["text"] == "Hello"
