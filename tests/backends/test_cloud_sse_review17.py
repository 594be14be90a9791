"""The cloud client's reading of event streams from servers that are not quite OpenAI's (review 17):
an event's JSON over several "data:" lines, error events ("event: error", llama.cpp's "error:"
lines), empty "data:" keepalives, and finish_reasons in other servers' words. Fake HTTP only."""

from __future__ import annotations

import json

import httpx
import pytest

from hybridllm import CloudUnavailableError, GenerationParams
from hybridllm.backends.cloud import CloudBackend

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=8, temperature=0)


class _Chunks(httpx.AsyncByteStream):
    """A body sent in the given pieces (each one read of the stream)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self):
        for chunk in self.chunks:
            yield chunk


def _cloud(chunks: list[bytes], ctype: str = "text/event-stream") -> CloudBackend:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Chunks(chunks), headers={"content-type": ctype})

    return CloudBackend(base_url="http://cloud.test", model="m", max_retries=0,
                        transport=httpx.MockTransport(handler))


def _event(text: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if text is None else {"content": text}
    return f"data: {json.dumps({'choices': [{'delta': delta, 'finish_reason': finish}]})}\n\n".encode()


def _read(cloud: CloudBackend) -> tuple[list[str], str | None]:
    texts, finish = [], None
    for delta in cloud.stream(MSGS, P):
        texts.append(delta.text)
        finish = delta.finish_reason or finish
    return [t for t in texts if t], finish


def test_an_events_json_over_several_data_lines_is_one_event():
    """SSE joins an event's "data:" lines with line breaks. Before: each line was parsed alone,
    'malformed event' on the first, and the answer went to the device."""
    pretty = json.dumps({"choices": [{"delta": {"content": "Hel"}, "finish_reason": None}]}, indent=1)
    multi = "".join(f"data: {line}\r\n" for line in pretty.splitlines()).encode() + b"\r\n"
    chunks = [multi[:17], multi[17:40], multi[40:], _event("lo"), _event(finish="stop"), b"data: [DONE]\n\n"]
    assert _read(_cloud(chunks)) == (["Hel", "lo"], "stop")
    body = b"".join(chunks)  # a byte a read: each CRLF split between two reads
    assert _read(_cloud([body[i:i + 1] for i in range(len(body))])) == (["Hel", "lo"], "stop")


def test_an_empty_data_line_is_a_keepalive_not_a_malformed_event():
    """Before: "data:" alone (a proxy's keepalive) failed the answer as 'malformed event: '''."""
    chunks = [b"data:\n\n", _event("Hi"), b"data: \n\n", _event(finish="stop"), b"data: [DONE]\n\n"]
    assert _read(_cloud(chunks)) == (["Hi"], "stop")


@pytest.mark.parametrize("frame", [
    b'event: error\ndata: {"message": "model overloaded, try later"}\n\n',  # an error event
    b"event: error\ndata: model overloaded, try later\n\n",  # its data plain text
    b"event: error\ndata: {\"error\": {\"message\":\ndata: \"model overloaded, try later\"}}\n\n",
    b"event: error\ndata: model overloaded, try later",  # the stream ends in it
    b'error: {"code": 500, "message": "model overloaded, try later"}\n\n',  # llama.cpp's server
])
@pytest.mark.parametrize("after_text", [False, True])
def test_an_error_event_fails_the_stream_with_the_servers_message(frame, after_text):
    """Before: the event was read as a chunk with no text (or its "error:" line skipped), so the
    stream 'ended before the answer did' and the server's message was lost."""
    cloud = _cloud(([_event("Hel")] if after_text else []) + [frame])
    with pytest.raises(CloudUnavailableError, match=r"reported an error mid-stream: .*model overloaded"):
        _read(cloud)


def test_an_error_events_type_ends_at_its_blank_line():
    """An "event: error" with no data, ended by a blank line, does not make the next event an error."""
    chunks = [b"event: error\n\n", _event("Hi"), _event(finish="stop"), b"data: [DONE]\n\n"]
    assert _read(_cloud(chunks)) == (["Hi"], "stop")


def test_an_event_whose_lines_never_end_it_is_bounded(monkeypatch):
    monkeypatch.setattr("hybridllm.backends.cloud_stream.MAX_LINE_CHARS", 1000)
    chunks = [_event("Hi")] + [b'data: {"choices": [' + b"1," * 50 + b"\n"] * 30
    with pytest.raises(CloudUnavailableError, match=r"sent an event over"):
        _read(_cloud(chunks))


def test_a_stream_that_ends_in_the_middle_of_an_event_fails():
    with pytest.raises(CloudUnavailableError, match=r"malformed event .*ended in it"):
        _read(_cloud([_event("Hi"), b'data: {"choices": [{"delta": {"content": "x']))


@pytest.mark.parametrize(("said", "means"), [
    ("max_tokens", "length"), ("MAX_TOKENS", "length"), ("model_length", "length"),
    ("SAFETY", "content_filter"), ("content_filtered", "content_filter"),
    ("eos_token", "stop"), ("length", "length"), ("content_filter", "content_filter"),
])
def test_finish_reasons_in_other_servers_words(said, means):
    """Before: any word but "length" and "content_filter" read as "stop": an answer cut at the
    length limit (Anthropic's, Gemini's "max_tokens", Mistral's "model_length") or by a filter
    was passed off as whole (and cached)."""
    chunks = [_event("Hi"), _event(finish=said), b"data: [DONE]\n\n"]
    assert _read(_cloud(chunks)) == (["Hi"], means)
    whole = {"choices": [{"message": {"content": "Hi"}, "finish_reason": said}]}
    g = _cloud([json.dumps(whole).encode()], ctype="application/json").generate(MSGS, P)
    assert (g.text, g.finish_reason) == ("Hi", means)


@pytest.mark.parametrize("said", ["abort", "error"])
def test_an_answer_the_server_gave_up_on_is_not_whole(said):
    """vLLM's "abort", Mistral's "error". Before: read as "stop", a cut answer passed off as whole."""
    with pytest.raises(CloudUnavailableError, match=rf"gave up on the answer \(finish_reason '{said}'\)"):
        _read(_cloud([_event("Hi"), _event(finish=said), b"data: [DONE]\n\n"]))
    whole = {"choices": [{"message": {"content": "Hi"}, "finish_reason": said}]}
    with pytest.raises(CloudUnavailableError, match=r"gave up on the answer"):
        _cloud([json.dumps(whole).encode()], ctype="application/json").generate(MSGS, P)
