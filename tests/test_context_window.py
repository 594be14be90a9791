"""A prompt longer than the device model's context: the cloud answers it when it can, otherwise a
clear ContextWindowExceededError (never the device's own failure), over the client, the proxy and
the chat command. Fakes first (fast), then the real SmolLM2 through llama.cpp."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from hybridllm import (
    AsyncHybridLLM,
    CloudBudgetSpentError,
    CloudUnavailableError,
    ContextWindowExceededError,
    Decision,
    HybridLLM,
    InvalidRequestError,
)
from hybridllm._types import GenerationParams, Messages, Usage, last_user_text
from hybridllm.backends.base import Delta, DeviceBackend
from hybridllm.backends.fake import FakeBackend
from hybridllm.prompts import PromptFormat
from tests._open_clients import close_clients_left_open  # noqa: F401 - an autouse fixture


class WordDevice(DeviceBackend):
    """A device backend with a word tokenizer (one token a word, 4 a message) and a small context:
    the context check is the real one every device backend shares."""

    name = "word-device"
    prompt_format = PromptFormat()

    def __init__(self, context_length: int = 32) -> None:
        self.model = "word-device"
        self._context_length = context_length
        self.counted = 0
        self.generated = 0

    @property
    def context_length(self) -> int:
        return self._context_length

    def tokenize(self, messages: Messages, *, prefix: str = "") -> list[int]:
        return [0] * (sum(len(str(m["content"]).split()) + 4 for m in messages) + len(prefix.split()))

    def count_tokens(self, messages: Messages) -> int:
        self.counted += 1
        return super().count_tokens(messages)

    def _run(self, tokens: list[int], params: GenerationParams, stops: tuple[str, ...]) -> Iterator[Delta]:
        self.generated += 1
        yield Delta("device answer")
        yield Delta("", finish_reason="stop", usage=Usage(len(tokens), 2))


class EdgeRouter:
    """A router that keeps everything on the device (a forced route and '@' aside)."""

    def decide(self, msgs, *, force=None, prompt_tokens=None, embedding=None):
        if "@" in last_user_text(msgs):
            return Decision("edge", "privacy: prompt contains email; kept on device", None, msgs,
                            ["email"], private=True)
        if force:
            return Decision(force, f"forced {force} by the caller", None, msgs, forced=True)
        return Decision("edge", "score 0.100 < threshold 0.500", 0.1, msgs)

    def should_escalate(self, lp):
        return False


class Cloud(FakeBackend):
    def __init__(self, fail: Exception | None = None, up: bool = True) -> None:
        super().__init__(model="cloud-model", reply=lambda m: "cloud answer", fail=fail)
        self.up = up

    def is_available(self) -> bool:
        return self.up


LONG = "word " * 40  # 44 tokens for WordDevice: past a context of 32
SHORT = "hello there"  # 6 tokens


def client(cloud=None, **settings) -> tuple[HybridLLM, WordDevice]:
    edge = WordDevice()
    return HybridLLM(edge=edge, cloud=cloud, policy=EdgeRouter() if cloud else None, cache=False,
                     **settings), edge


def test_a_prompt_past_the_context_goes_to_the_cloud_though_the_router_said_edge():
    llm, edge = client(Cloud())
    c = llm.chat(LONG)
    assert c.route == "cloud" and c.text == "cloud answer"
    assert c.reason == "too long for the device: 44 prompt tokens, n_ctx 32"
    stream = llm.stream(LONG)
    assert "".join(ch.text for ch in stream) == "cloud answer"
    assert stream.completion.route == "cloud" and "44 prompt tokens, n_ctx 32" in stream.completion.reason
    assert edge.generated == 0
    assert llm.chat(SHORT).route == "edge"  # what fits still goes where the router says


def test_the_context_must_hold_the_prompt_and_one_answer_token():
    # 32 tokens in a context of 32 leave no room for an answer: the cloud; 31 fit
    llm, _ = client(Cloud())
    assert llm.chat("word " * 28).route == "cloud"  # 28 + 4 = 32
    assert llm.chat("word " * 27).route == "edge"  # 31
    # max_tokens does not push a prompt off the device: its answer stops where the context ends
    assert llm.chat("word " * 27, max_tokens=500).route == "edge"


def test_without_a_cloud_a_clear_error_with_the_numbers_sync_async_and_streamed():
    llm, edge = client()
    with pytest.raises(ContextWindowExceededError) as info:
        llm.chat(LONG)
    err = info.value
    assert isinstance(err, InvalidRequestError)  # what callers caught before still catches it
    assert (err.prompt_tokens, err.context_length) == (44, 32)
    assert "44 tokens" in str(err) and "context holds 32" in str(err)
    assert "cloud_url" in str(err) and "Shorten" in str(err)
    with pytest.raises(ContextWindowExceededError, match="cloud_url"):
        list(llm.stream(LONG))

    async def run():
        a = AsyncHybridLLM.wrap(llm)
        with pytest.raises(ContextWindowExceededError, match="context holds 32"):
            await a.chat(LONG)
        with pytest.raises(ContextWindowExceededError, match="context holds 32"):
            async with a.stream(LONG) as s:
                async for _ in s:
                    pass

    asyncio.run(run())
    assert edge.generated == 0  # refused before the device generates anything


@pytest.mark.parametrize(
    ("cloud", "prompt", "options", "settings", "says"),
    [
        (Cloud(), "mail jo@example.com " + LONG, {}, {}, "privacy keeps it on the device"),
        (Cloud(), LONG, {"route": "edge"}, {}, "route='edge'"),
    ],
    ids=["privacy", "forced-edge"],
)
def test_when_the_cloud_cannot_take_it_a_clear_error_says_why(cloud, prompt, options, settings, says):
    llm, edge = client(cloud, **settings)
    for call in (lambda: llm.chat(prompt, **options), lambda: list(llm.stream(prompt, **options))):
        with pytest.raises(ContextWindowExceededError) as info:
            call()
        assert says in str(info.value) and "context holds 32" in str(info.value)
    assert edge.generated == 0


@pytest.mark.parametrize(
    ("cloud", "settings", "error", "says"),
    [
        (Cloud(up=False), {}, CloudUnavailableError, "the cloud is unavailable"),
        (Cloud(fail=CloudUnavailableError("connection refused")), {}, CloudUnavailableError,
         "the cloud failed (connection refused)"),
        (Cloud(), {"max_cloud_calls_per_hour": 0}, CloudBudgetSpentError, "budget spent: 0/0 cloud calls"),
    ],
    ids=["cloud-unavailable", "cloud-fails", "budget-spent"],
)
def test_when_the_cloud_cannot_take_it_now_the_error_says_retry(cloud, settings, error, says):
    # the prompt is fine for the cloud: a retry helps, shortening is not required
    llm, edge = client(cloud, **settings)
    for call in (lambda: llm.chat(LONG), lambda: list(llm.stream(LONG))):
        with pytest.raises(error) as info:
            call()
        assert not isinstance(info.value, ContextWindowExceededError)
        assert says in str(info.value) and "Retry" in str(info.value)
        assert (info.value.prompt_tokens, info.value.context_length) == (44, 32)
    assert edge.generated == 0


class BreakingCloud(Cloud):
    def stream(self, messages, params):
        yield Delta("cloud begins")
        raise CloudUnavailableError("connection reset mid-stream")


def test_a_cloud_stream_that_breaks_off_a_long_prompt_ends_in_a_clear_error():
    llm, edge = client(BreakingCloud())
    stream = llm.stream(LONG)
    with pytest.raises(CloudUnavailableError, match="stream broke off mid-answer") as info:
        for _chunk in stream:
            pass
    assert (info.value.prompt_tokens, info.value.context_length) == (44, 32)


def test_the_prompt_is_counted_once_per_request():
    llm, edge = client(Cloud(), max_cloud_tokens_per_day=10_000)
    llm.chat(LONG)
    llm.chat(SHORT)
    assert edge.counted == 2


def test_the_device_backend_itself_raises_the_same_error():
    # the check every device backend shares (llama.cpp, ONNX Runtime) names the numbers too
    with pytest.raises(ContextWindowExceededError) as info:
        list(WordDevice().stream([{"role": "user", "content": LONG}], GenerationParams()))
    assert (info.value.prompt_tokens, info.value.context_length) == (44, 32)


# --- hybridllm serve -------------------------------------------------------------------------


def test_the_proxy_answers_400_context_length_exceeded():
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    llm, _ = client()
    body = {"model": "x", "messages": [{"role": "user", "content": LONG}]}
    with TestClient(create_app(llm)) as http:
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
        assert "44 tokens" in error["message"] and "context holds 32" in error["message"]
        r = http.post("/v1/chat/completions", json={**body, "stream": True})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        ok = http.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "hi"}]})
        assert ok.status_code == 200
    llm.close()


# --- hybridllm chat --------------------------------------------------------------------------


class TokenizingDevice(WordDevice):
    def __init__(self) -> None:
        super().__init__(context_length=64)
        self.seen: list[list[dict]] = []

    def _stream(self, messages, params, prefix):
        self.seen.append([dict(m) for m in messages])
        return super()._stream(messages, params, prefix)


def _chat(monkeypatch, capsys, cloud, lines):
    from hybridllm import cli
    from hybridllm._client import HybridLLM as Real

    edge = TokenizingDevice()
    made: list[Real] = []

    def build(**kw):
        made.append(Real(edge=edge, cloud=cloud, policy=EdgeRouter(), cache=False))
        return made[-1]

    monkeypatch.setattr("hybridllm._client.HybridLLM", build)
    monkeypatch.setattr("sys.stdin", _Piped(lines))
    code = cli.main(["chat", "--max-tokens", "8"])
    out, err = capsys.readouterr()
    return code, out, err, edge


class _Piped:
    def __init__(self, lines):
        import io

        self.buffer = io.StringIO("".join(f"{line}\n" for line in lines))

    def isatty(self):
        return False

    def readline(self):
        return self.buffer.readline()


class RecordingCloud(Cloud):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.sent: list[int] = []

    def stream(self, messages, params):
        self.sent.append(len(messages))
        yield from super().stream(messages, params)


TURNS = [f"question {i} " + "word " * 12 for i in range(5)]  # 18 tokens each, answers 6


def test_chat_sends_a_long_conversation_to_the_cloud_whole(monkeypatch, capsys):
    cloud = RecordingCloud()
    code, out, err, edge = _chat(monkeypatch, capsys, cloud, TURNS)
    assert code == 0 and "dropped" not in err
    assert cloud.sent and cloud.sent[-1] == 9  # every turn went, none dropped
    assert out.count("cloud answer") == len(cloud.sent)


def test_chat_trims_and_answers_on_the_device_when_the_cloud_fails(monkeypatch, capsys):
    cloud = RecordingCloud(fail=CloudUnavailableError("connection refused"))
    code, out, err, edge = _chat(monkeypatch, capsys, cloud, TURNS)
    assert code == 0, err
    assert out.count("device answer") == 5 and "error:" not in err
    assert "the cloud could not take it: dropped its" in err
    assert all(len(edge.tokenize(msgs)) + 8 <= 64 for msgs in edge.seen)
    assert edge.seen[-1][-1]["content"] == TURNS[-1].strip()  # the new question is always kept


# --- the real SmolLM2 through llama.cpp ------------------------------------------------------


REAL_LONG = "Tell me about this: " + "the quick brown fox jumps over the lazy dog. " * 40


def _real(smollm2_path, cloud=None):
    from hybridllm.backends.base import create_backend

    edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=256, n_threads=1)
    return HybridLLM(edge=edge, cloud=cloud, policy=EdgeRouter() if cloud else None, cache=False,
                     max_tokens=8, temperature=0.0)


@pytest.mark.real
def test_real_model_without_a_cloud_raises_a_clear_error(smollm2_path):
    with _real(smollm2_path) as llm:
        n = llm.edge.count_tokens([{"role": "user", "content": REAL_LONG}])
        assert n > llm.edge.context_length == 256
        for call in (lambda: llm.chat(REAL_LONG), lambda: list(llm.stream(REAL_LONG))):
            with pytest.raises(ContextWindowExceededError) as info:
                call()
            assert (info.value.prompt_tokens, info.value.context_length) == (n, 256)
            assert "configure a cloud (cloud_url=...)" in str(info.value)
        assert llm.chat("Say hi.").route == "edge"  # the device still answers what fits


@pytest.mark.real
def test_real_model_sends_a_long_prompt_to_the_cloud(smollm2_path):
    cloud = Cloud()
    with _real(smollm2_path, cloud) as llm:
        n = llm.edge.count_tokens([{"role": "user", "content": REAL_LONG}])
        c = llm.chat(REAL_LONG)
        assert c.route == "cloud" and c.reason == f"too long for the device: {n} prompt tokens, n_ctx 256"
        stream = llm.stream(REAL_LONG)
        assert "".join(ch.text for ch in stream) == "cloud answer" and stream.completion.route == "cloud"
        assert llm.chat("Say hi.").route == "edge"
        cloud.up = False  # the circuit opens: the device cannot stand in for this one
        with pytest.raises(CloudUnavailableError, match="the cloud is unavailable"):
            llm.chat(REAL_LONG)
